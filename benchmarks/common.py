"""What every benchmark section shares: settings for the embedded bench stack, progress lines,
bounded waits, reading results with their Kafka timestamps, and Spark progress counters."""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from hotswap.contract.settings import Settings
from hotswap.executor.tools.generator import GeneratorReport, GeneratorSpec, produce
from hotswap.service_sink.audit import read_topic_records
from hotswap.service_sink.progress import parse_spark_time

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / ".hotswap" / "bench"
RESULTS_DIR = REPO / "bench" / "results"
QUERY = REPO / "examples" / "count_per_key.sql"  # the reference query: count and sum per key per 10 s window
CHANGED = REPO / "examples" / "average_per_key.py"  # the change: other logic, other columns, same 10 s window
LATENESS_MS = 2_000
WINDOW_MS = 10_000
KEYS = 1_000


def settings_for(name: str) -> Settings:
    """A fresh namespace (own topics, checkpoints, Redis keys) on the bench stack's ports."""
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


class Clock:
    """Prints one line per step with the seconds since the benchmark started (flushed: `make`
    pipes stdout, and a long run must show where it is)."""

    def __init__(self) -> None:
        self.began = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def step(self, message: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {message}", flush=True)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: no {what} within {timeout_s:.0f}s")
        time.sleep(poll_s)


@dataclass
class Load:
    """A generator running in a thread, paced at `spec.rate` with event time = wall time."""

    settings: Settings
    spec: GeneratorSpec
    stop: threading.Event = field(default_factory=threading.Event)
    report: GeneratorReport | None = None
    thread: threading.Thread | None = None

    def start(self) -> Load:
        def run() -> None:
            self.report = produce(self.settings, self.spec, self.settings.source_topic, self.stop)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def halt(self) -> GeneratorReport | None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=60)
        return self.report


def live_spec(rate: float, seed: int) -> GeneratorSpec:
    # time_scale=1 and start_ts=None (now): event time tracks wall time, so "the moment a window
    # could close" (window end + lateness) is a wall-clock moment we can subtract from.
    return GeneratorSpec(rate=rate, keys=KEYS, seed=seed, disorder_ms=200, time_scale=1.0)


@dataclass(frozen=True)
class Emitted:
    """One result row with the time Kafka stamped on it."""

    emit_ms: int  # record timestamp: the producer's wall clock when Spark's Kafka sink sent it
    window_start: int
    window_end: int
    query_id: str
    n: int  # events the result counts (both bench queries output `n`)


def read_emitted(settings: Settings) -> list[Emitted]:
    out: list[Emitted] = []
    for record in read_topic_records(settings, settings.sink_topic, timeout_s=60):
        row = json.loads(record.value)
        out.append(
            Emitted(
                emit_ms=int(record.timestamp),
                window_start=int(row["window_start"]),
                window_end=int(row["window_end"]),
                query_id=str(row.get("query_id")),
                n=int(row.get("n") or 0),
            )
        )
    return sorted(out, key=lambda e: e.emit_ms)


def source_counts(settings: Settings, window_ms: int = WINDOW_MS) -> dict[int, int]:
    """Events in the source topic per window start: what a complete result must count."""
    counts: dict[int, int] = {}
    for record in read_topic_records(settings, settings.source_topic, timeout_s=120):
        ts = int(json.loads(record.value)["ts"])
        start = ts - ts % window_ms
        counts[start] = counts.get(start, 0) + 1
    return counts


class RowCounter:
    """Source rows a Spark query has processed, summed over its distinct batches, with the start
    time of its first batch that read any (from `recentProgress`, so a poll never misses one)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], int] = {}
        self.first_input_ms: int | None = None

    def update(self, query: StreamingQuery) -> int:
        for progress in query.recentProgress:
            rows = int(progress.get("numInputRows") or 0)
            self.rows[(str(progress["id"]), int(progress["batchId"]))] = rows
            started = parse_spark_time(progress.get("timestamp"))
            if rows and started is not None and (self.first_input_ms is None or started < self.first_input_ms):
                self.first_input_ms = started
        return sum(self.rows.values())


def active_query(spark: SparkSession, name: str) -> StreamingQuery | None:
    return next((q for q in spark.streams.active if q.name == name), None)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values (a section that measured nothing says so)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def window_gaps(emitted: list[Emitted], lo_ms: int, hi_ms: int) -> float | None:
    """Largest wall-clock gap (s) between consecutive windows' first results, over the windows first
    emitted within [lo_ms, hi_ms] (plus the one just before, so a gap that starts earlier counts)."""
    first: dict[int, int] = {}
    for e in emitted:
        first[e.window_end] = min(first.get(e.window_end, e.emit_ms), e.emit_ms)
    times = sorted(first.values())
    gaps = [(b - a) / 1000 for a, b in itertools.pairwise(times) if b >= lo_ms and a <= hi_ms]
    return max(gaps) if gaps else None


def coverage(emitted: list[Emitted], counts: dict[int, int]) -> dict[str, Any]:
    """Windows between the first and last emitted one: missing (no result), duplicated (a
    (window, key) answered twice is caught by the audit; here a window counted more events than
    the source holds), and events the results do not count."""
    by_window: dict[int, int] = {}
    for e in emitted:
        by_window[e.window_start] = by_window.get(e.window_start, 0) + e.n
    if not by_window:
        return {"windows": 0, "missing_windows": 0, "incomplete_windows": 0, "events_lost": 0, "events_extra": 0}
    lo, hi = min(by_window), max(by_window)
    missing = incomplete = lost = extra = 0
    for start in range(lo, hi + WINDOW_MS, WINDOW_MS):
        got, want = by_window.get(start), counts.get(start, 0)
        if got is None:
            missing += 1
            lost += want
        elif got < want:
            incomplete += 1
            lost += want - got
        elif got > want:
            extra += got - want
    return {
        "windows": (hi - lo) // WINDOW_MS + 1,
        "missing_windows": missing,
        "incomplete_windows": incomplete,
        "events_lost": lost,
        "events_extra": extra,
    }


def batch_durations(spark: SparkSession) -> dict[str, dict[str, Any]]:
    """Per running query: how long its recent micro-batches took (Spark's triggerExecution), the
    stages a result waits for. Read from `recentProgress` (Spark keeps the last 100)."""
    out: dict[str, dict[str, Any]] = {}
    for query in spark.streams.active:
        took = [
            float(p["durationMs"]["triggerExecution"])
            for p in query.recentProgress
            if "triggerExecution" in (p.get("durationMs") or {})
        ]
        p50, p90 = percentile(took, 50), percentile(took, 90)
        out[str(query.name)] = {"batches": len(took), "p50_ms": p50, "p90_ms": p90}
    return out
