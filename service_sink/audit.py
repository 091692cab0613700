"""Reading back the results topic and checking the invariants an operator cares about:
each (window, group) answered once, by one query version, with no gap between windows."""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from hotswap.contract.settings import KafkaSettings
from hotswap.service_sink.errors import TopicReadIncomplete


@dataclass(frozen=True)
class Result:
    key: str
    query_id: str
    window_start: int
    window_end: int
    row: dict[str, Any]


@dataclass(frozen=True)
class Audit:
    results: int
    windows_by_query: dict[str, int]
    missing_windows: list[tuple[int, int]] = field(default_factory=list)
    duplicate_results: int = 0
    overlapping_windows: int = 0

    @property
    def ok(self) -> bool:
        return not self.missing_windows and self.duplicate_results == 0 and self.overlapping_windows == 0


def read_topic_records(kafka: KafkaSettings, topic: str, timeout_s: float = 10.0) -> list[Any]:
    """Every record currently in `topic` (kafka-python ConsumerRecords), in offset order per
    partition, up to the end offsets seen on entry. Raises TopicReadIncomplete if `timeout_s` runs
    out first: a partial read would pass for a topic with fewer records."""
    consumer = KafkaConsumer(**kafka.kafka_python_config(), enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        deadline = time.monotonic() + timeout_s
        out: list[Any] = []
        while any(consumer.position(tp) < end[tp] for tp in parts):
            if time.monotonic() >= deadline:
                behind = {tp.partition: end[tp] - consumer.position(tp) for tp in parts}
                raise TopicReadIncomplete(
                    f"read {len(out)} records of topic {topic} in {timeout_s:.0f}s, but records are still "
                    f"unread per partition: {behind}; is the broker overloaded?"
                )
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(records)
        # A partition may have returned records past the end seen on entry: keep the snapshot exact.
        return [r for r in out if r.offset < end[TopicPartition(topic, r.partition)]]
    finally:
        consumer.close()


def read_results(kafka: KafkaSettings, topic: str, timeout_s: float = 10.0) -> list[Result]:
    """Every result currently in the results topic, in offset order per partition."""
    out: list[Result] = []
    for record in read_topic_records(kafka, topic, timeout_s):
        row = json.loads(record.value)
        out.append(
            Result(
                key=record.key.decode() if record.key else "",
                query_id=str(row.get("query_id")),
                window_start=int(row["window_start"]),
                window_end=int(row["window_end"]),
                row=row,
            )
        )
    return out


def audit(results: list[Result]) -> Audit:
    keys = Counter(r.key for r in results)
    windows: dict[tuple[int, int], set[str]] = defaultdict(set)
    for r in results:
        windows[(r.window_start, r.window_end)].add(r.query_id)
    by_query: Counter[str] = Counter()
    for owners in windows.values():
        for owner in owners:
            by_query[owner] += 1
    ordered = sorted(windows)
    # A sliding version's windows overlap by design (a version owns windows by their end), and so
    # may the windows on either side of a cut to or from one: overlap is counted between tumbling
    # windows only. A gap is time no window covers.
    sliding = _sliding_queries(windows)
    missing: list[tuple[int, int]] = []
    overlapping = sum(1 for owners in windows.values() if len(owners) > 1)
    covered_until = ordered[0][1] if ordered else 0
    for (start_a, end_a), (start_b, end_b) in itertools.pairwise(ordered):
        if start_b > covered_until:
            missing.append((covered_until, start_b))
        covered_until = max(covered_until, end_b)
        tumbling = not (windows[(start_a, end_a)] | windows[(start_b, end_b)]) & sliding
        if tumbling and start_b < end_a:
            overlapping += 1
    return Audit(
        results=len(results),
        windows_by_query=dict(by_query),
        missing_windows=missing,
        duplicate_results=sum(n - 1 for n in keys.values() if n > 1),
        overlapping_windows=overlapping,
    )


def _sliding_queries(windows: dict[tuple[int, int], set[str]]) -> set[str]:
    """Query versions two of whose windows overlap: sliding windows."""
    by_query: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for span, owners in windows.items():
        for owner in owners:
            by_query[owner].append(span)
    return {
        query for query, spans in by_query.items() if any(b[0] < a[1] for a, b in itertools.pairwise(sorted(spans)))
    }
