"""Section 3: sustained throughput, measured as the drain rate of a pre-loaded backlog.

Why a backlog: the generator is Python (json.dumps and kafka-python per event) and tops out near
the rate we want to measure, so a live search for the highest lag-bounded rate would measure the
generator. Instead the same seeded events (1,000 keys) are written first, as fast as Kafka takes
them (that send rate is reported as the generator's own limit), and each side then reads the
backlog in bounded micro-batches (max_offsets_per_trigger, the same for both). Drain rate = events
/ (caught up - start of the first batch that read any), a proxy for the highest sustainable rate:
a pipeline that drains N events in T seconds keeps up with any rate below N / T. The two sides
alternate: plain Spark, hotswap (and again in full mode).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from benchmarks.common import KEYS, LATENESS_MS, QUERY, WINDOW_MS, Clock, RowCounter, active_query, settings_for
from benchmarks.memory import MemorySampler
from benchmarks.restart import start_plain
from hotswap.contract.models import now_ms
from hotswap.contract.settings import Settings
from hotswap.execution_graph.source import load_query_source
from hotswap.executor.control.controller import Executor
from hotswap.executor.control.topics import Topics
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.tools.generator import GeneratorSpec, produce
from hotswap.service_sink.progress import parse_spark_time

T0 = 1_700_000_000_000  # a fixed past event time: the backlog is replayed, not live
EVENT_TIME_RATE = 1_000  # events per second of event time: 10,000 per 10 s window over 1,000 keys


@dataclass
class Drain:
    side: str
    events: int
    generator_rate: float
    seconds: float = 0.0
    rate: float = 0.0
    series: list[tuple[int, int]] = field(default_factory=list)  # (wall ms, source rows processed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "events": self.events,
            "generator_send_rate": round(self.generator_rate),
            "drain_s": round(self.seconds, 2),
            "events_per_s": round(self.rate),
            "series": self.series,
        }


def preload(settings: Settings, events: int) -> tuple[int, float]:
    """Write the backlog; returns the caught-up target (the last closable window) and the send rate."""
    Topics(settings).ensure(settings.source_topic, settings.source_partitions)
    rate = 1e9  # never pace: send as fast as the producer goes
    span_s = events / EVENT_TIME_RATE
    spec = GeneratorSpec(
        rate=rate, keys=KEYS, seed=1, count=events, disorder_ms=500, time_scale=span_s * rate / events, start_ts=T0
    )
    report = produce(settings, spec, settings.source_topic)
    assert report.last_ts is not None
    return report.last_ts - LATENESS_MS - WINDOW_MS, report.sent / report.elapsed_s


def _drain(drain: Drain, began_ms: int, counter: RowCounter, sample: Any, caught_up: Any, timeout_s: float) -> Drain:
    deadline = time.monotonic() + timeout_s
    while not caught_up():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: {drain.side} did not drain {drain.events} events in {timeout_s:.0f}s")
        drain.series.append((now_ms(), sample()))
        time.sleep(0.5)
    drain.series.append((now_ms(), sample()))
    done = now_ms()
    start = counter.first_input_ms or began_ms
    drain.seconds = (done - start) / 1000
    drain.rate = drain.events / drain.seconds
    return drain


def plain_drain(spark: SparkSession, events: int, timeout_s: float, clock: Clock) -> Drain:
    settings = settings_for("tp-plain")
    target, gen_rate = preload(settings, events)
    clock.step(f"throughput: plain Spark; {events:,} events pre-loaded at {gen_rate:,.0f} ev/s; draining")
    Topics(settings).ensure(settings.sink_topic, 1)
    began = now_ms()
    query = start_plain(spark, settings, QUERY, "plain", "earliest")
    counter = RowCounter()

    def caught_up() -> bool:
        progress = query.lastProgress
        watermark = parse_spark_time(progress["eventTime"].get("watermark")) if progress else None
        return watermark is not None and watermark >= target

    try:
        return _drain(
            Drain("plain_spark", events, gen_rate), began, counter, lambda: counter.update(query), caught_up, timeout_s
        )
    finally:
        query.stop()


def hotswap_drain(spark: SparkSession, events: int, timeout_s: float, clock: Clock) -> Drain:
    settings = settings_for("tp-hotswap")
    target, gen_rate = preload(settings, events)
    clock.step(f"throughput: hotswap; {events:,} events pre-loaded at {gen_rate:,.0f} ev/s; draining")
    client = Client(settings, redis_client(settings))
    executor = Executor(settings, spark, redis_client(settings))
    stop = threading.Event()
    began = now_ms()
    thread = threading.Thread(target=executor.run, args=(load_query_source(QUERY), stop), daemon=True)
    thread.start()
    counter = RowCounter()

    def sample() -> int:
        # Source rows the service graph has routed: the first stage of hotswap's pipeline.
        service = active_query(spark, settings.names.service_query)
        return counter.update(service) if service is not None else sum(counter.rows.values())

    def caught_up() -> bool:
        # The end of the pipeline: the execution graph committed every window through the target.
        graph = client.status().graphs.get(QUERY.stem)
        progress = graph.progress if graph else None
        return progress is not None and (progress.committed_watermark or 0) >= target

    try:
        return _drain(Drain("hotswap", events, gen_rate), began, counter, sample, caught_up, timeout_s)
    finally:
        stop.set()
        thread.join(timeout=120)


def run_throughput(
    spark: SparkSession, events: int, rounds: int, timeout_s: float, clock: Clock, memory: MemorySampler
) -> dict[str, Any]:
    drains: list[Drain] = []
    for _ in range(rounds):
        memory.phase = "throughput_plain"
        drains.append(plain_drain(spark, events, timeout_s, clock))
        clock.step(f"throughput: plain Spark drained at {drains[-1].rate:,.0f} ev/s")
        memory.phase = "throughput_hotswap" if events < 1_000_000 else "backlog_1m_catch_up"
        drains.append(hotswap_drain(spark, events, timeout_s, clock))
        clock.step(f"throughput: hotswap drained at {drains[-1].rate:,.0f} ev/s")
    memory.phase = "idle"
    plain = max(d.rate for d in drains if d.side == "plain_spark")
    hot = max(d.rate for d in drains if d.side == "hotswap")
    return {
        "method": "drain rate of a pre-loaded backlog (proxy for the highest sustainable rate; see README)",
        "plain_spark_events_per_s": round(plain),
        "hotswap_events_per_s": round(hot),
        "throughput_ratio": round(hot / plain, 3),
        "generator_send_rate": round(min(d.generator_rate for d in drains)),
        "runs": [d.as_dict() for d in drains],
    }
