"""Section 2 (the baseline): the same change made the way users make it today. A plain Spark
Kafka-to-Kafka query runs the reference query; it is stopped, and the new version starts on a
fresh checkpoint from `latest` offsets (an incompatible change cannot reuse the old checkpoint).
Measured on the results topic: the output gap, windows missing, windows not fully counted,
events lost and duplicates, under the same load as the hotswap run.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from benchmarks.common import (
    CHANGED,
    LATENESS_MS,
    QUERY,
    Clock,
    Load,
    coverage,
    live_spec,
    percentile,
    read_emitted,
    settings_for,
    source_counts,
    wait_for,
    window_gaps,
)
from hotswap.contract.models import now_ms
from hotswap.contract.settings import Settings
from hotswap.execution_graph.source import load_query_source
from hotswap.execution_graph.user_query import apply_query
from hotswap.executor.control.topics import Topics
from hotswap.service_sink.audit import audit, read_results
from hotswap.service_sink.results import ResultWriter


def plain_events(spark: SparkSession, settings: Settings, starting: str) -> DataFrame:
    """The source as a plain user would read it: parse JSON, event time, Spark's own watermark."""
    return (
        spark.readStream.format("kafka")
        .options(**settings.spark_kafka_options())
        .option("subscribe", settings.source_topic)
        .option("startingOffsets", starting)
        .option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
        .load()
        .selectExpr("from_json(CAST(value AS STRING), 'key STRING, value DOUBLE, ts BIGINT') AS e")
        .selectExpr("e.key AS key", "e.value AS value", "e.ts AS ts", "timestamp_millis(e.ts) AS event_time")
        .withWatermark("event_time", f"{LATENESS_MS} milliseconds")
    )


def start_plain(spark: SparkSession, settings: Settings, query: Path, version: str, starting: str) -> StreamingQuery:
    """One plain query writing through the same ResultWriter hotswap uses (same keys and JSON)."""
    output = apply_query(spark, plain_events(spark, settings, starting), load_query_source(query))
    return (
        output.writeStream.outputMode("append")
        .queryName(f"plain-{settings.namespace}-{version}")
        .option("checkpointLocation", str(settings.names.checkpoint_root / f"plain-{version}"))
        .foreachBatch(ResultWriter(settings, version, ("key",)))
        .start()
    )


def run_restart(spark: SparkSession, rate: float, steady_s: float, after_s: float, clock: Clock) -> dict[str, Any]:
    settings = settings_for("restart")
    topics = Topics(settings)
    topics.ensure(settings.source_topic, settings.source_partitions)
    topics.ensure(settings.sink_topic, 1)
    # The first version reads from the start: the source is empty until the load begins, so its
    # first window is complete and only the restart can lose anything.
    old = start_plain(spark, settings, QUERY, QUERY.stem, "earliest")
    load: Load | None = None
    new: StreamingQuery | None = None
    try:
        load = Load(settings, live_spec(rate, seed=2)).start()
        clock.step(f"restart: plain query running; load {rate:.0f} ev/s; waiting for first results")
        wait_for(lambda: _has_results(settings), 120, "first plain results", poll_s=1.0)
        time.sleep(steady_s)
        stop_ms = now_ms()
        # stop() interrupts the batch in flight, as a user's restart does; py4j logs that
        # interruption of the Python foreachBatch as an error with a long trace, which is expected here.
        py4j_log = logging.getLogger("py4j.clientserver")
        level = py4j_log.level
        py4j_log.setLevel(logging.CRITICAL)
        try:
            old.stop()
        finally:
            py4j_log.setLevel(level)
        new = start_plain(spark, settings, CHANGED, CHANGED.stem, "latest")
        started_ms = now_ms()
        clock.step(
            f"restart: stopped, new version started in {(started_ms - stop_ms) / 1000:.1f}s; running {after_s:.0f}s"
        )
        time.sleep(after_s)
    finally:
        if load is not None:
            load.halt()
        for query in (old, new):
            if query is not None and query.isActive:
                query.stop()
    clock.step("restart: reading results and the source back")
    results = read_emitted(settings)
    checked = audit(read_results(settings, timeout_s=60))
    first_new = min((e.emit_ms for e in results if e.query_id == CHANGED.stem), default=None)
    steady = [float(e.emit_ms - e.window_end - LATENESS_MS) for e in results if e.emit_ms < stop_ms]
    p50, p99 = percentile(steady, 50), percentile(steady, 99)
    return {
        "stop_at_ms": stop_ms,
        "new_started_at_ms": started_ms,
        "first_new_result_at_ms": first_new,
        "stop_to_first_new_result_s": None if first_new is None else round((first_new - stop_ms) / 1000, 3),
        "steady_p50_latency_s": None if p50 is None else round(p50 / 1000, 3),
        "steady_p99_latency_s": None if p99 is None else round(p99 / 1000, 3),
        "output_gap_s": {
            "steady_max": window_gaps(results, 0, stop_ms - 1),
            "around_restart_max": window_gaps(results, stop_ms, (first_new or stop_ms) + 5_000),
        },
        "audit": {
            "results": checked.results,
            "windows_by_query": checked.windows_by_query,
            "missing_windows": len(checked.missing_windows),
            "duplicate_results": checked.duplicate_results,
            "overlapping_windows": checked.overlapping_windows,
        },
        "coverage": coverage(results, source_counts(settings)),
        "series": [
            (e.emit_ms, round((e.emit_ms - e.window_end - LATENESS_MS) / 1000, 3), e.query_id)
            for e in results[:: max(1, len(results) // 3000)]
        ],
    }


def _has_results(settings: Settings) -> bool:
    try:
        return bool(read_emitted(settings))
    except Exception:  # noqa: BLE001 - the topic may not answer yet; keep polling
        return False
