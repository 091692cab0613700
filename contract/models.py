"""Messages and records kept in Redis. Small, immutable, JSON-serialisable values."""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field


def now_ms() -> int:
    """Wall-clock epoch milliseconds, for records shown to people (never for time budgets)."""
    return time.time_ns() // 1_000_000


class Record(BaseModel):
    # extra="ignore": a record written by a newer hotswap still reads here.
    model_config = ConfigDict(frozen=True, extra="ignore")

    def changed(self, **changes: object) -> Self:
        """A copy with `changes`, validated as a new record. A field name the record does not have
        is an error: `model_copy(update=...)` would drop it without a word."""
        unknown = set(changes) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        return type(self).model_validate({**self.model_dump(), **changes})


class QueryKind(StrEnum):
    SQL = "sql"
    PYTHON = "python"


class QuerySource(Record):
    """A user query as submitted: its text travels through Redis, so the executor needs no access
    to the submitter's files."""

    name: str
    kind: QueryKind
    text: str
    path: str | None = None


class GraphState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    RETIRED = "retired"
    FAILED = "failed"


class GraphRecord(Record):
    """One execution graph: a user query version, its input topic and its Spark query."""

    query_id: str
    source: QuerySource
    window_ms: int
    topic: str
    group_columns: tuple[str, ...] = ()
    state: GraphState = GraphState.STARTING
    created_at: int = Field(default_factory=now_ms)
    started_at: int | None = None
    retired_at: int | None = None
    # The id Spark keeps in the graph's checkpoint, chosen before its first start; a checkpoint
    # naming another id is never resumed (None: a record from before this field existed).
    spark_query_id: str | None = None
    # For a graph that took over a failed graph's topic: rows with event time before this were
    # the failed graph's, whose windows it emitted through here; they are skipped.
    start_after: int | None = None


def new_spark_query_id() -> str:
    return str(uuid.uuid4())


class ExecutorPhase(StrEnum):
    """The executor's own lifecycle, recorded so an operator (and a successor) can see it."""

    BOOTSTRAPPING = "bootstrapping"  # reading Redis and the checkpoints, resuming graphs
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


EXECUTOR_TRANSITIONS: dict[ExecutorPhase, frozenset[ExecutorPhase]] = {
    ExecutorPhase.STOPPED: frozenset({ExecutorPhase.BOOTSTRAPPING}),
    ExecutorPhase.BOOTSTRAPPING: frozenset({ExecutorPhase.RUNNING, ExecutorPhase.STOPPING}),
    ExecutorPhase.RUNNING: frozenset({ExecutorPhase.STOPPING}),
    ExecutorPhase.STOPPING: frozenset({ExecutorPhase.STOPPED}),
}


class NamespaceRecord(Record):
    """Written once, by the namespace's first executor (see Keys.namespace_record)."""

    created_by: str
    at: int = Field(default_factory=now_ms)


class ExecutorRecord(Record):
    holder: str
    phase: ExecutorPhase
    at: int = Field(default_factory=now_ms)


class CurrentQuery(Record):
    query_id: str
    started_at: int


class NodePosition(Record):
    """One source partition of the service graph ("node")."""

    window_end: int | None = None  # end of the largest window it has routed
    event_time: int | None = None  # largest event time it has routed
    offset: int = -1  # largest source offset it has read
    last_data_at: int = 0  # wall-clock ms of the last batch that brought it rows
    idle: bool = False  # set aside: no new rows for idle_timeout, so it does not hold the watermark


class ServiceState(Record):
    """The service graph after its last routed batch."""

    last_batch: int = -1
    watermark: int | None = None
    partitions: dict[str, NodePosition] = Field(default_factory=dict)

    @property
    def idle_partitions(self) -> list[str]:
        return sorted((p for p, n in self.partitions.items() if n.idle), key=int)

    @property
    def max_window_end(self) -> int | None:
        ends = [p.window_end for p in self.partitions.values() if p.window_end is not None]
        return max(ends) if ends else None


class CutRoute(Record):
    """While a swap is between cut and retire: rows with event time before `boundary` still go
    to the old graph."""

    swap_id: str
    boundary: int
    old_query: str
    old_topic: str


class RoutingPlan(Record):
    """The write-ahead routing decision for one service-graph batch."""

    batch_id: int
    target_query: str
    target_topic: str
    cut: CutRoute | None = None
    late_before: int | None = None  # rows with event time before this are late
    ahead_after: int | None = None  # rows with event time after this are dead-lettered (max_time_jump)
    decided_at: int = Field(default_factory=now_ms)


class GraphProgress(Record):
    """What the service sink reports about one execution graph after its batches."""

    query_id: str
    batch_id: int = -1
    watermark: int | None = None
    num_input_rows: int = 0
    input_offsets: dict[str, dict[str, int]] = Field(default_factory=dict)
    committed_batch: int = -1
    committed_watermark: int | None = None
    updated_at: int = Field(default_factory=now_ms)
