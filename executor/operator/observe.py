"""What the live view, the dashboard and the metrics read: one snapshot of the namespace's control
state (the status document, the counters, the graph records) and of Kafka's positions (the end of
the results topic, the rows waiting in each graph's topic), and rates between two snapshots.

Nothing here is stored: every view derives from the journal and the control state in Redis, and
from Kafka's own offsets, so none of them keeps a second truth. Rates are differences of
cumulative counts.

Results written are read from Kafka: the sum of the results topic's end offsets. Counting them
where they are written would cost each result batch a second Spark job (a `foreachBatch` write
to Kafka reports no row count, and an observed metric never completes on that write path). The
offsets cost one request per snapshot; a batch that Spark replays after a crash writes its rows
again and is counted again, which only a crash causes.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hotswap.contract.journal import active_swap
from hotswap.contract.models import GraphRecord, GraphState, now_ms
from hotswap.contract.names import DEAD_LETTER, ROUTED
from hotswap.contract.settings import KafkaSettings
from hotswap.contract.status import Status, SwapStatus
from hotswap.executor.operator.client import Client


@dataclass(frozen=True)
class Snapshot:
    status: Status
    counters: dict[str, int]
    graphs: dict[str, GraphRecord]
    at_ms: int  # wall clock, for elapsed times shown to people
    taken_s: float  # monotonic, for rates
    # Rows waiting in each running graph's topic (its end offset minus the graph's last read
    # offset), when Kafka was read; absent otherwise.
    backlog: dict[str, int] = field(default_factory=dict)
    # Records in the results topic (the sum of its end offsets), when Kafka was read.
    results_written: int | None = None

    def per_query(self, prefix: str) -> dict[str, int]:
        return {k.removeprefix(prefix): v for k, v in self.counters.items() if k.startswith(prefix)}

    @property
    def dead_letters_by_reason(self) -> dict[str, int]:
        """Dead letters by reason code (every dead letter is counted with its reason)."""
        return dict(sorted(self.per_query(DEAD_LETTER).items()))

    @property
    def source_read(self) -> int:
        """Source rows the service graph has read: the sum of its partitions' next offsets."""
        return sum(p.offset + 1 for p in self.status.service.partitions.values())

    @property
    def active_swap(self) -> SwapStatus | None:
        """The swap in progress: the one the executor drives (the rule of contract.journal.active_swap),
        else a stranded one, which waits for a rollback or a fix; None when neither."""
        driven = active_swap(self.status.swaps)
        return driven or next((s for s in self.status.swaps if s.state.is_stranded), None)

    @property
    def last_swap(self) -> SwapStatus | None:
        return self.status.swaps[-1] if self.status.swaps else None

    def current_record(self) -> GraphRecord | None:
        current = self.status.current
        return self.graphs.get(current.query_id) if current else None


@dataclass(frozen=True)
class Rates:
    """Per second, between two snapshots; empty before the second one."""

    routed: dict[str, float] = field(default_factory=dict)
    results: float | None = None
    source_read: float | None = None

    @property
    def routed_total(self) -> float | None:
        return sum(self.routed.values()) if self.routed else None


def rates(before: Snapshot | None, after: Snapshot) -> Rates:
    if before is None or after.taken_s <= before.taken_s:
        return Rates()
    elapsed = after.taken_s - before.taken_s

    old, new = before.per_query(ROUTED), after.per_query(ROUTED)
    results = None
    if before.results_written is not None and after.results_written is not None:
        results = max(0, after.results_written - before.results_written) / elapsed
    return Rates(
        routed={q: max(0, n - old.get(q, 0)) / elapsed for q, n in new.items()},
        results=results,
        source_read=max(0, after.source_read - before.source_read) / elapsed,
    )


class RateWindow:
    """Rates over the last `span_s` seconds of snapshots, not between the last two: the service
    graph and the results move in batches a second or two apart, and a rate between snapshots half
    a second apart jumps between 0 and twice the truth."""

    def __init__(self, span_s: float = 5.0) -> None:
        self._span_s = span_s
        self._kept: deque[Snapshot] = deque()

    def add(self, snap: Snapshot) -> Rates:
        # Keep the newest snapshot at least `span_s` old: the rate always spans that long, or more.
        while len(self._kept) >= 2 and snap.taken_s - self._kept[1].taken_s >= self._span_s:
            self._kept.popleft()
        oldest = self._kept[0] if self._kept else None
        self._kept.append(snap)
        return rates(oldest, snap)


@dataclass(frozen=True)
class Positions:
    backlog: dict[str, int]
    results_written: int


class KafkaPositions:
    """Kafka's offsets the views read: the end of the results topic, and the rows waiting in each
    running graph's topic (its end offset minus the graph's last read offset, from its progress
    report). The buffer of a swap's new graph fills from the cut on, and empties as its query
    catches up."""

    def __init__(self, kafka: KafkaSettings, sink_topic: str | None) -> None:
        self._kafka = kafka
        self._sink_topic = sink_topic
        self._consumer: Any = None

    def read(self, client: Client, graphs: dict[str, GraphRecord]) -> Positions:
        from kafka import KafkaConsumer, TopicPartition  # imported only by the views that read Kafka

        if self._consumer is None:
            self._consumer = KafkaConsumer(**self._kafka.kafka_python_config(), enable_auto_commit=False)
        sink = self._sink_topic
        # None: the results go to a table (contract.sink), whose rows the views do not count.
        sink_parts = (
            []
            if sink is None
            else [TopicPartition(sink, p) for p in sorted(self._consumer.partitions_for_topic(sink) or [])]
        )
        running = {q: g for q, g in graphs.items() if g.state in (GraphState.STARTING, GraphState.RUNNING)}
        graph_parts = {q: TopicPartition(g.topic, 0) for q, g in running.items()}
        ends = self._consumer.end_offsets([*sink_parts, *graph_parts.values()])
        backlog: dict[str, int] = {}
        for query_id, part in graph_parts.items():
            progress = client.progress(query_id)
            read = progress.input_offsets.get(part.topic, {}).get("0", 0) if progress else 0
            backlog[query_id] = max(0, int(ends.get(part, 0)) - read)
        return Positions(backlog, sum(int(ends.get(p, 0)) for p in sink_parts))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def take_snapshot(client: Client, kafka: KafkaPositions | None = None) -> Snapshot:
    status = client.status()
    graphs = client.graph_records()
    positions = None
    if kafka is not None:
        try:
            positions = kafka.read(client, graphs)
        except Exception:  # noqa: BLE001 - Kafka unreachable: the view shows everything else
            positions = None
    return Snapshot(
        status=status,
        counters=client.counters(),
        graphs=graphs,
        at_ms=now_ms(),
        taken_s=time.monotonic(),
        backlog=positions.backlog if positions else {},
        results_written=positions.results_written if positions else None,
    )
