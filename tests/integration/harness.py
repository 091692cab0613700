"""Running the executor inside the test process, and an offline oracle for the results."""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from pyspark.sql import SparkSession

from contract.settings import Settings
from execution_graph.user_query import load_query_source
from executor.client import redis_client
from executor.controller import Executor
from service_sink.audit import Result
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]
QUERIES = Path(__file__).resolve().parent / "queries"


class RunningExecutor:
    """An executor in a background thread of the test process, sharing its SparkSession."""

    def __init__(self, settings: Settings, spark: SparkSession, query: Path) -> None:
        self.executor = Executor(settings, spark, redis_client(settings))
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(query,), daemon=True, name="test-executor")

    def _run(self, query: Path) -> None:
        try:
            self.executor.run(load_query_source(query), self._stop)
        except BaseException as exc:
            self._errors.append(exc)
            raise

    def start(self) -> RunningExecutor:
        self._thread.start()
        wait_until(lambda: self.executor.ready.is_set() or not self._thread.is_alive(), 240, "the executor to run")
        self.check()
        return self

    def check(self) -> None:
        if self._errors:
            raise AssertionError(f"executor died: {self._errors[0]!r}") from self._errors[0]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "executor did not stop within 120 s"


@contextlib.contextmanager
def executor_running(settings: Settings, spark: SparkSession, query: Path) -> Iterator[RunningExecutor]:
    running = RunningExecutor(settings, spark, query).start()
    try:
        yield running
    finally:
        running.stop()


# -- reading topics back ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


def read_topic(settings: Settings, topic: str) -> list[Record]:
    consumer = KafkaConsumer(**settings.kafka_python_config(), enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        out: list[Record] = []
        while any(consumer.position(tp) < end[tp] for tp in parts):
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(
                    Record(r.partition, r.offset, r.key, r.value, {k: v for k, v in (r.headers or [])}) for r in records
                )
        return out
    finally:
        consumer.close()


@dataclass(frozen=True)
class SourceEvent:
    partition: int
    offset: int
    key: str
    value: float
    ts: int


def source_events(settings: Settings) -> list[SourceEvent]:
    events = []
    for r in read_topic(settings, settings.source_topic):
        body = json.loads(r.value)
        events.append(SourceEvent(r.partition, r.offset, body["key"], float(body["value"]), int(body["ts"])))
    return events


def late_event_ids(settings: Settings) -> set[tuple[int, int]]:
    return {
        (int(b["partition"]), int(b["offset"]))
        for b in (json.loads(r.value) for r in read_topic(settings, settings.late_topic))
    }


# -- the oracle ------------------------------------------------------------------------------------
Aggregate = Callable[[list[SourceEvent]], dict[str, float]]


def count_and_total(events: list[SourceEvent]) -> dict[str, float]:
    return {"n": len(events), "total": sum(e.value for e in events)}


def peak_and_low(events: list[SourceEvent]) -> dict[str, float]:
    return {"peak": max(e.value for e in events), "low": min(e.value for e in events)}


def mean_and_n(events: list[SourceEvent]) -> dict[str, float]:
    return {"mean": sum(e.value for e in events) / len(events), "n": len(events)}


@dataclass(frozen=True)
class Version:
    query_id: str
    window_ms: int
    aggregate: Aggregate


def expected_results(
    events: list[SourceEvent], versions: list[Version], cuts: list[int], closed_until: int
) -> dict[tuple[int, str], tuple[str, int, dict[str, float]]]:
    """(window_start, key) -> (owning query, window_end, values) for every closed window.

    Version i owns event times in [cuts[i-1], cuts[i]); windows close when their end is at or
    before `closed_until`.
    """
    bounds = [-math.inf, *cuts, math.inf]
    grouped: dict[tuple[int, str, int], list[SourceEvent]] = defaultdict(list)
    for e in events:
        for i, version in enumerate(versions):
            if bounds[i] <= e.ts < bounds[i + 1]:
                start = (e.ts // version.window_ms) * version.window_ms
                grouped[(i, e.key, start)].append(e)
                break
    out: dict[tuple[int, str], tuple[str, int, dict[str, float]]] = {}
    for (i, key, start), group in grouped.items():
        version = versions[i]
        end = start + version.window_ms
        if end <= closed_until:
            out[(start, key)] = (version.query_id, end, version.aggregate(group))
    return out


def assert_invariants(
    results: list[Result],
    events: list[SourceEvent],
    versions: list[Version],
    cuts: list[int],
    closed_until: int,
) -> None:
    """Exactly once per (window, group), owned by the right version, no gap, correct values."""
    seen: dict[tuple[int, str], Result] = {}
    for r in results:
        identity = (r.window_start, str(r.row["key"]))
        assert identity not in seen, f"duplicate result for window {identity}: {seen[identity].row} and {r.row}"
        seen[identity] = r
    expected = expected_results(events, versions, cuts, closed_until)
    missing = sorted(set(expected) - set(seen))
    assert not missing, f"{len(missing)} closed (window, key) results missing, first {missing[:5]}"
    for identity, result in seen.items():
        if identity not in expected:
            # A window that closed after `closed_until` may already be out; it must still be owned right.
            continue
        owner, end, values = expected[identity]
        assert result.query_id == owner, f"window {identity} answered by {result.query_id}, owner is {owner}"
        assert result.window_end == end, f"window {identity} ends at {result.window_end}, expected {end}"
        for name, value in values.items():
            assert math.isclose(float(result.row[name]), value, rel_tol=1e-9, abs_tol=1e-6), (
                f"window {identity} {name}={result.row[name]}, recomputed {value}"
            )
    # Ownership for every result, closed or not: at or before W the old version, after it the new.
    bounds = [-math.inf, *cuts, math.inf]
    for r in results:
        version = next(v for i, v in enumerate(versions) if bounds[i] <= r.window_start < bounds[i + 1])
        assert r.query_id == version.query_id, f"window starting {r.window_start} answered by {r.query_id}"
