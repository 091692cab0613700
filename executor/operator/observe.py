"""What the live view, the dashboard and the metrics read: one snapshot of the namespace's control
state (the status document, the counters, the graph records), and rates between two snapshots.

Nothing here is stored: every view derives from the journal and the control state in Redis, so
none of them keeps a second truth. Rates are differences of the cumulative counters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hotswap.contract.models import GraphRecord, GraphState, now_ms
from hotswap.contract.settings import Settings
from hotswap.contract.status import Status, SwapStatus
from hotswap.executor.operator.client import Client

ROUTED = "routed:"  # counters hash: rows the service graph routed to each graph (cumulative)
RESULTS = "results:"  # counters hash: result rows each graph wrote (service_sink.results)
DEAD_LETTER = "dead_letter:"  # counters hash: dead-lettered rows by reason code
UNCLASSIFIED = "unclassified"  # dead letters counted before reasons were (their total minus the reasons')


@dataclass(frozen=True)
class Snapshot:
    status: Status
    counters: dict[str, int]
    graphs: dict[str, GraphRecord]
    at_ms: int  # wall clock, for elapsed times shown to people
    taken_s: float  # monotonic, for rates
    # Rows waiting in each running graph's topic (its end offset minus the graph's last read
    # offset), when a Kafka client was given; absent otherwise.
    backlog: dict[str, int] = field(default_factory=dict)
    # The schema a query reads when its record does not say (the executor's `events` schema).
    default_schema: str | None = None

    def per_query(self, prefix: str) -> dict[str, int]:
        return {k.removeprefix(prefix): v for k, v in self.counters.items() if k.startswith(prefix)}

    @property
    def dead_letters_by_reason(self) -> dict[str, int]:
        """Dead letters by reason code; what no reason accounts for is `unclassified`."""
        by_reason = self.per_query(DEAD_LETTER)
        rest = self.status.dead_letter_records - sum(by_reason.values())
        if rest > 0:
            by_reason[UNCLASSIFIED] = rest
        return dict(sorted(by_reason.items()))

    @property
    def source_read(self) -> int:
        """Source rows the service graph has read: the sum of its partitions' next offsets."""
        return sum(p.offset + 1 for p in self.status.service.partitions.values())

    @property
    def active_swap(self) -> SwapStatus | None:
        """The swap in progress (the first unfinished one past submission), else None."""
        return next((s for s in self.status.swaps if not s.state.is_terminal and s.phases), None)

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
    results: dict[str, float] = field(default_factory=dict)
    source_read: float | None = None

    @property
    def routed_total(self) -> float | None:
        return sum(self.routed.values()) if self.routed else None

    @property
    def results_total(self) -> float | None:
        return sum(self.results.values()) if self.results else None


def rates(before: Snapshot | None, after: Snapshot) -> Rates:
    if before is None or after.taken_s <= before.taken_s:
        return Rates()
    elapsed = after.taken_s - before.taken_s

    def per_second(prefix: str) -> dict[str, float]:
        old, new = before.per_query(prefix), after.per_query(prefix)
        return {q: max(0, n - old.get(q, 0)) / elapsed for q, n in new.items()}

    return Rates(
        routed=per_second(ROUTED),
        results=per_second(RESULTS),
        source_read=max(0, after.source_read - before.source_read) / elapsed,
    )


def query_schema(record: GraphRecord | None, default: str | None = None) -> str | None:
    """The schema a graph's query reads, as its record carries it (a DDL string), else `default`."""
    if record is None:
        return default
    for name in ("schema_ddl", "source_schema", "schema"):
        value = getattr(record, name, None)
        if isinstance(value, str) and value:
            return value
    return default


class Backlog:
    """Rows waiting in running graphs' topics: Kafka's end offset minus the graph's last read offset
    (from its progress report). The buffer of a swap's new graph fills from the cut on, and empties
    as its query catches up."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._consumer: Any = None

    def read(self, client: Client, graphs: dict[str, GraphRecord]) -> dict[str, int]:
        from kafka import KafkaConsumer, TopicPartition  # only the live view needs Kafka

        running = {q: g for q, g in graphs.items() if g.state in (GraphState.STARTING, GraphState.RUNNING)}
        if not running:
            return {}
        if self._consumer is None:
            self._consumer = KafkaConsumer(**self._settings.kafka_python_config(), enable_auto_commit=False)
        parts = {q: TopicPartition(g.topic, 0) for q, g in running.items()}
        ends = self._consumer.end_offsets(list(parts.values()))
        out: dict[str, int] = {}
        for query_id, part in parts.items():
            progress = client.progress(query_id)
            read = (progress.input_offsets.get(part.topic, {}).get("0", 0)) if progress else 0
            out[query_id] = max(0, int(ends.get(part, 0)) - read)
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def take_snapshot(client: Client, backlog: Backlog | None = None, default_schema: str | None = None) -> Snapshot:
    status = client.status()
    graphs = client.graph_records()
    waiting: dict[str, int] = {}
    if backlog is not None:
        try:
            waiting = backlog.read(client, graphs)
        except Exception:  # noqa: BLE001 - Kafka unreachable: the view shows everything else
            waiting = {}
    return Snapshot(
        status=status,
        counters=client.counters(),
        graphs=graphs,
        at_ms=now_ms(),
        taken_s=time.monotonic(),
        backlog=waiting,
        default_schema=default_schema,
    )
