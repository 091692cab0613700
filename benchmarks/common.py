"""What every benchmark section shares: the contenders, settings for the embedded bench stack, the
run's context (Spark, the resource sampler, progress lines), the generator and results watcher of a
namespace, and the arithmetic on results (latency, gaps, coverage of the source)."""

from __future__ import annotations

import itertools
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from benchmarks.probe import Emission, LoadProcess, ResultWatcher
from benchmarks.resources import Resources
from hotswap.contract.models import GraphEngine
from hotswap.contract.settings import Settings
from hotswap.executor.control.topics import Topics
from hotswap.service_sink.audit import read_topic_records

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / ".hotswap" / "bench"
RESULTS_DIR = REPO / "bench" / "results"
QUERY = REPO / "examples" / "count_per_key.sql"  # the reference query: count and sum per key per 10 s window
CHANGED = REPO / "examples" / "average_per_key.py"  # the change: other logic, other columns, same 10 s window
LATENESS_MS = 2_000
WINDOW_MS = 10_000
KEYS = 1_000
DISORDER_MS = 200


# The contenders, in the order each round runs them: plain Spark, then hotswap on each execution-graph
# engine (`graph_engine`; `graph_partitions` left unset, so a closing graph's topic has as many
# partitions as the source topic). "hotswap" is the stateful engine under the name every earlier
# run used, so its JSON keys read as before.
PLAIN = "plain_spark"
ENGINES: dict[str, GraphEngine] = {"hotswap": GraphEngine.STATEFUL, "hotswap_closing": GraphEngine.CLOSING}
SIDES = (PLAIN, *ENGINES)


def suffix(side: str) -> str:
    """What a hotswap side adds to the names of its phases and report sections: nothing for the
    stateful engine (the names from before there were two), `_closing` for the closing one."""
    return side.removeprefix("hotswap") if side in ENGINES else ""


def live_key(side: str) -> str:
    """The report section of a hotswap side's live swaps: `live`, `live_closing`."""
    return f"live{suffix(side)}"


def settings_for(name: str, source_topic: str | None = None, engine: GraphEngine = GraphEngine.STATEFUL) -> Settings:
    """A fresh namespace (own topics, checkpoints, Redis keys) on the bench stack's ports, whose
    execution graphs run on `engine` (given explicitly, so HOTSWAP_GRAPH_ENGINE or
    HOTSWAP_GRAPH_PARTITIONS in the environment cannot turn one contender into the other)."""
    namespace = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    return Settings(
        graph_engine=engine,
        graph_partitions=None,
        home=HOME,
        jars_dir=REPO / ".hotswap" / "jars",
        kafka_port=29092,
        kafka_controller_port=29093,
        redis_port=26379,
        namespace=namespace,
        source_topic=source_topic or f"{namespace}.events",
        sink_topic=f"{namespace}.results",
        lateness=f"{LATENESS_MS}ms",
        log_level="warning",
        # The bench swaps in examples/average_per_key.py: Python queries are allowed here explicitly.
        query_kinds="sql,python",
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


@dataclass
class Bench:
    """What every section runs with."""

    spark: SparkSession
    clock: Clock
    resources: Resources
    quick: bool

    def kafka(self, settings: Settings) -> dict[str, Any]:
        return settings.kafka_python_config()

    def topics(self, settings: Settings) -> None:
        """The namespace's source and results topics, created before anything reads them."""
        topics = Topics(settings.kafka, settings.pipeline, settings.timeouts)
        try:
            topics.ensure(settings.source_topic, settings.source_partitions)
            topics.ensure(settings.sink_topic, settings.source_partitions)
        finally:
            topics.close()

    def watcher(self, settings: Settings) -> ResultWatcher:
        return ResultWatcher(self.kafka(settings), settings.sink_topic)

    def load(self, settings: Settings, rate: float, seed: int) -> LoadProcess:
        return LoadProcess(self.kafka(settings), settings.source_topic, rate, seed, KEYS, DISORDER_MS)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: no {what} within {timeout_s:.0f}s")
        time.sleep(poll_s)


@dataclass(frozen=True)
class Emitted:
    """One result row with the time Kafka stamped on it."""

    emit_ms: int  # record timestamp: the producer's wall clock when Spark's Kafka sink sent it
    window_start: int
    window_end: int
    query_id: str
    n: int  # events the result counts (both bench queries output `n`)


def emitted_from(rows: list[Emission]) -> list[Emitted]:
    return sorted((Emitted(*row) for row in rows), key=lambda e: e.emit_ms)


def latency_ms(e: Emitted) -> float:
    """How long after its window could first close (window end + lateness) a result came out."""
    return float(e.emit_ms - (e.window_end + LATENESS_MS))


def stats(values: list[float]) -> dict[str, Any]:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "results": len(values),
        "p50_s": None if p50 is None else round(p50 / 1000, 3),
        "p99_s": None if p99 is None else round(p99 / 1000, 3),
    }


def source_counts(settings: Settings, window_ms: int = WINDOW_MS) -> dict[int, int]:
    """Events in the source topic per window start: what a complete result must count."""
    counts: dict[int, int] = {}
    for record in read_topic_records(settings.kafka, settings.source_topic, timeout_s=120):
        ts = int(json.loads(record.value)["ts"])
        start = ts - ts % window_ms
        counts[start] = counts.get(start, 0) + 1
    return counts


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


def audit_summary(checked: Any) -> dict[str, Any]:
    return {
        "results": checked.results,
        "windows_by_query": checked.windows_by_query,
        "missing_windows": len(checked.missing_windows),
        "duplicate_results": checked.duplicate_results,
        "overlapping_windows": checked.overlapping_windows,
    }


def latency_series(results: list[Emitted]) -> list[tuple[int, float, str]]:
    """At most about 3,000 points for the plot."""
    return [(e.emit_ms, round(latency_ms(e) / 1000, 3), e.query_id) for e in results[:: max(1, len(results) // 3000)]]
