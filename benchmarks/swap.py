"""`make bench`: hotswap against a plain Spark query, and how long a live swap takes.

1. Catch-up throughput. The same pre-loaded events (seeded) and the same SQL, once through hotswap
   (service graph -> execution graph -> service sink) and once as a plain Spark query reading the
   source topic. Measured: seconds from start until every closed window is committed.
2. Swap latency. Under continuous load, several swaps; per swap, seconds from submit to completed
   and per phase.

It runs its own embedded stack on ports 29092/29093/26379 under .hotswap/bench and stops it after.
Results are printed and written to .hotswap/bench/results.json.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from contract.settings import Settings
from execution_graph.source import load_query_source
from execution_graph.user_query import apply_query
from executor.control.controller import Executor
from executor.control.spark_session import build_spark_session
from executor.control.topics import Topics
from executor.logs import configure_logging
from executor.operator.client import Client, redis_client
from executor.stack import EmbeddedStack
from executor.tools.generator import GeneratorSpec, produce
from service_sink.progress import parse_spark_time
from service_sink.results import ResultWriter

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / ".hotswap" / "bench"
QUERY = REPO / "examples" / "count_per_key.sql"
REPLACEMENTS = [REPO / "examples" / "max_per_key_30s.sql", REPO / "examples" / "average_per_key.py", QUERY]
EVENTS = 60_000
T0 = 1_700_000_000_000
LATENESS_MS = 2_000


def settings_for(name: str) -> Settings:
    namespace = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    return Settings(
        home=HOME,
        jars_dir=REPO / ".hotswap" / "jars",
        kafka_port=29092,
        kafka_controller_port=29093,
        redis_port=26379,
        namespace=namespace,
        source_topic=f"{namespace}.events",
        sink_topic=f"{namespace}.results",
        lateness=f"{LATENESS_MS}ms",
        log_level="warning",
    )


def preload(settings: Settings) -> int:
    """EVENTS events over 600 s of event time, sent as fast as Kafka takes them; returns the last ts."""
    Topics(settings).ensure(settings.source_topic, settings.source_partitions)
    spec = GeneratorSpec(rate=1_000_000, keys=10, seed=1, count=EVENTS, disorder_ms=500, time_scale=10_000, start_ts=T0)
    report = produce(settings, spec, settings.source_topic)
    assert report.last_ts is not None
    return report.last_ts


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: no {what} within {timeout_s:.0f}s")
        time.sleep(0.2)


def hotswap_catch_up(spark: SparkSession) -> float:
    settings = settings_for("hotswap")
    target = preload(settings) - LATENESS_MS - 10_000
    client = Client(settings, redis_client(settings))
    executor = Executor(settings, spark, redis_client(settings))
    stop = threading.Event()
    began = time.monotonic()
    thread = threading.Thread(target=executor.run, args=(load_query_source(QUERY), stop), daemon=True)
    thread.start()

    def caught_up() -> bool:
        graph = client.status().graphs.get("count_per_key")
        progress = graph.progress if graph else None
        return progress is not None and (progress.committed_watermark or 0) >= target

    try:
        wait_for(caught_up, 600, "hotswap catch-up")
        return time.monotonic() - began
    finally:
        stop.set()
        thread.join(timeout=120)


def plain_spark_catch_up(spark: SparkSession) -> float:
    settings = settings_for("plain")
    target = preload(settings) - LATENESS_MS - 10_000
    began = time.monotonic()
    # The same parsing, watermark and SQL, reading the source topic directly: no routing layer.
    raw = (
        spark.readStream.format("kafka")
        .options(**settings.spark_kafka_options())
        .option("subscribe", settings.source_topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("from_json(CAST(value AS STRING), 'key STRING, value DOUBLE, ts BIGINT') AS e")
        .selectExpr("e.key AS key", "e.value AS value", "e.ts AS ts", "timestamp_millis(e.ts) AS event_time")
        .withWatermark("event_time", f"{LATENESS_MS} milliseconds")
    )
    output = apply_query(spark, raw, load_query_source(QUERY))
    query = (
        output.writeStream.outputMode("append")
        .option("checkpointLocation", str(settings.names.checkpoint_root / "plain"))
        .foreachBatch(ResultWriter(settings, "plain", ("key",)))
        .start()
    )

    def caught_up() -> bool:
        progress = query.lastProgress
        watermark = parse_spark_time(progress["eventTime"].get("watermark")) if progress else None
        return watermark is not None and watermark >= target

    try:
        wait_for(caught_up, 600, "plain Spark catch-up")
        return time.monotonic() - began
    finally:
        query.stop()


def swap_latency(spark: SparkSession) -> list[dict[str, float]]:
    settings = settings_for("swaps")
    Topics(settings).ensure(settings.source_topic, settings.source_partitions)
    client = Client(settings, redis_client(settings))
    executor = Executor(settings, spark, redis_client(settings))
    stop, stop_load = threading.Event(), threading.Event()
    thread = threading.Thread(target=executor.run, args=(load_query_source(QUERY), stop), daemon=True)
    spec = GeneratorSpec(rate=500, keys=10, seed=2, disorder_ms=500, time_scale=10, start_ts=T0)
    load = threading.Thread(target=produce, args=(settings, spec, settings.source_topic, stop_load), daemon=True)
    thread.start()
    load.start()
    swaps: list[dict[str, float]] = []
    try:
        wait_for(executor.ready.is_set, 300, "executor start")
        for query in REPLACEMENTS:
            record = client.submit(query, f"{query.stem}-{len(swaps)}")
            done = client.wait_until_done(record.id, 300)
            at = {p.name.value: p.at for p in done.phases}
            names = list(at)
            row = {f"{a}->{b}": (at[b] - at[a]) / 1000 for a, b in itertools.pairwise(names)}
            row["total"] = (at["completed"] - at["submitted"]) / 1000
            swaps.append(row)
        return swaps
    finally:
        stop_load.set()
        stop.set()
        thread.join(timeout=120)


def main() -> None:
    configure_logging("console", "warning")
    base = settings_for("stack")
    stack = EmbeddedStack(base)
    stack.up()
    spark = build_spark_session(base)
    try:
        plain = plain_spark_catch_up(spark)
        hotswap = hotswap_catch_up(spark)
        swaps = swap_latency(spark)
    finally:
        spark.stop()
        stack.down()
    totals = [s["total"] for s in swaps]
    results = {
        "events": EVENTS,
        "plain_spark_catch_up_s": round(plain, 1),
        "hotswap_catch_up_s": round(hotswap, 1),
        "plain_spark_events_per_s": round(EVENTS / plain),
        "hotswap_events_per_s": round(EVENTS / hotswap),
        "swap_total_s": [round(t, 1) for t in totals],
        "swap_total_median_s": round(statistics.median(totals), 1),
        "swap_phases_s": swaps,
    }
    HOME.mkdir(parents=True, exist_ok=True)
    (HOME / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
