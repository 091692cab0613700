"""Messages and records kept in Redis. Small, immutable, JSON-serialisable values."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from pydantic import Field

from hotswap.contract.errors import HotswapError
from hotswap.contract.frozen import Record, now_ms
from hotswap.contract.source import SourceSpec
from hotswap.contract.windows import Windowing

__all__ = ["Record", "now_ms"]  # re-exported: every room imports them from here


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
    # The schema this version reads, when it declares its own (`submit --source-schema DDL`, or
    # `--avro-schema FILE` as .avsc text for an Avro source); None: the schema of the query it replaces.
    source_schema: str | None = None
    avro_schema: str | None = None


class GraphEngine(StrEnum):
    """How an execution graph computes its windows (docs/architecture.md, "Two graph engines")."""

    # A Spark streaming aggregation over the graph's topic, closed by Spark's watermark, which the
    # markers move: one partition per graph topic, a deduplication and an aggregation state store.
    STATEFUL = "stateful"
    # The graph's stream only reads the route headers; when every partition's marker has passed a
    # window, that window is computed once, as a Spark batch job over its rows read back by offset.
    CLOSING = "closing"


class GraphState(StrEnum):
    """Where an execution graph is in its life (docs/architecture.md, "A graph's life")."""

    # The moves between states are GRAPH_TRANSITIONS; `GraphRecord.moved` is the one way a state changes.

    STARTING = "starting"  # recorded; its query does not run yet (validated, deploying, a first deploy)
    RUNNING = "running"  # its query runs: it serves, or will from its swap's cut (deployed, shadowing)
    # Its query failed for good, yet the graph keeps what it owns: the windows after its cut wait in its
    # topic for a rollback or fix that takes it over (or for an executor restart, which tries it again).
    FAILED = "failed"
    RETIRED = "retired"  # served, emitted every window it owns, and stopped: owns nothing more
    DISCARDED = "discarded"  # never served: its swap ended before the cut (aborted, failed) or none needed it

    @property
    def is_ended(self) -> bool:
        """Retired or discarded: it owns nothing, its query never runs again, its topic is no buffer of
        its own, and retention may forget it."""
        return self in (GraphState.RETIRED, GraphState.DISCARDED)

    def can_become(self, target: GraphState) -> bool:
        return target in GRAPH_TRANSITIONS[self]


class IllegalGraphMove(HotswapError):
    """A graph was asked to move to a state it cannot reach from where it is."""


# Each state's legal next states. A failed graph runs again when an executor restart resumes it and it
# is seen running (a deploy's `deployed`); it is retired by the swap that takes it over, or discarded
# if it failed before its swap's cut. A retired or discarded graph never moves again.
GRAPH_TRANSITIONS: Mapping[GraphState, frozenset[GraphState]] = MappingProxyType(
    {
        GraphState.STARTING: frozenset({GraphState.RUNNING, GraphState.FAILED, GraphState.DISCARDED}),
        GraphState.RUNNING: frozenset({GraphState.FAILED, GraphState.RETIRED, GraphState.DISCARDED}),
        GraphState.FAILED: frozenset({GraphState.RUNNING, GraphState.RETIRED, GraphState.DISCARDED}),
        GraphState.RETIRED: frozenset(),
        GraphState.DISCARDED: frozenset(),
    }
)


class SkippedRows(Record):
    """Rows of a graph's topic that its query skips: a batch it failed on for good, sent to the
    dead-letter topic (`poison_batches = dead_letter`). Offsets from `start` up to, not including,
    `end`; for a closing graph, only the rows of the windows it was closing (event time from
    `since_ms`, None: any, up to `until_ms`, not included)."""

    partition: int
    start: int
    end: int
    batch_id: int  # the graph's batch that failed on them
    since_ms: int | None = None
    until_ms: int | None = None

    def holds(self, partition: int, offset: int, event_time: int | None) -> bool:
        if partition != self.partition or not self.start <= offset < self.end:
            return False
        if event_time is None:
            return self.since_ms is None and self.until_ms is None
        return (self.since_ms is None or event_time >= self.since_ms) and (
            self.until_ms is None or event_time < self.until_ms
        )


class GraphRecord(Record):
    """One execution graph: a user query version, its input topic and its Spark query."""

    query_id: str
    source: QuerySource
    window_ms: int
    topic: str
    group_columns: tuple[str, ...] = ()
    state: GraphState = GraphState.STARTING
    created_at: int = Field(default_factory=now_ms)
    started_at: int | None = None  # first seen running
    retired_at: int | None = None  # retired or discarded: when it ended
    # The id Spark keeps in the graph's checkpoint, chosen when the graph is recorded (before its
    # first start); a checkpoint naming another id is never resumed.
    spark_query_id: str
    # For a graph that took over a failed graph's topic: rows with event time before this were
    # the failed graph's, whose windows it emitted through here; they are skipped.
    start_after: int | None = None
    # How this version reads the source topic: the namespace's format and event time, with its own
    # schema (the one it declared, else the one of the query it replaced).
    reads: SourceSpec
    # How often a window starts (window_ms for tumbling windows).
    slide_ms: int
    # A shadow's graph: the results of windows it does not own (all of them until it is promoted)
    # go to this topic instead of being dropped (None: not a shadow).
    shadow_results_topic: str | None = None
    # How the graph computes its windows, and how many partitions its topic has (a stateful graph
    # reads one: Spark's max-based watermark is only safe on a single partition).
    engine: GraphEngine = GraphEngine.STATEFUL
    partitions: int = Field(default=1, ge=1)
    skipped: tuple[SkippedRows, ...] = ()

    @property
    def windowing(self) -> Windowing:
        return Windowing(self.window_ms, self.slide_ms)

    def moved(self, state: GraphState, **changes: object) -> GraphRecord:
        """This graph in `state`, with `changes`: the one way a graph's state changes. Raises
        IllegalGraphMove for a move GRAPH_TRANSITIONS does not allow. Running for the first time
        stamps `started_at`; retired or discarded, `retired_at`."""
        if not self.state.can_become(state):
            raise IllegalGraphMove(f"graph {self.query_id} cannot go from {self.state} to {state}")
        stamps: dict[str, object] = {}
        if state is GraphState.RUNNING and self.started_at is None:
            stamps["started_at"] = now_ms()
        if state.is_ended:
            stamps["retired_at"] = now_ms()
        return self.changed(state=state, **{**stamps, **changes})

    @property
    def reads_from(self) -> int | None:
        """For a graph that took over a failed graph's topic: the earliest event time it reads. It
        owns windows ending after `start_after`, and a sliding window ending there starts
        size - slide earlier (README, "Sliding windows")."""
        return None if self.start_after is None else self.start_after - self.windowing.reach_ms


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
    # How the service graph reads the source (format, event time): fixed for the namespace's life,
    # so a replayed batch finds the same event times.
    source: SourceSpec


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


class Destination(Record):
    """A graph that receives the data rows whose event time lies in [`since`, `until`) (None:
    unbounded). A row may go to two graphs: a sliding window that ends after the cut starts before
    it, and a shadow receives rows beside the current graph (README, "Sliding windows", "Shadow runs")."""

    query_id: str
    topic: str
    since: int | None = None
    until: int | None = None
    # The partitions of the graph's topic: source partition p goes to graph partition p mod this,
    # so each source partition's rows stay in order within one graph partition.
    partitions: int = 1

    def holds(self, event_time: int) -> bool:
        return (self.since is None or event_time >= self.since) and (self.until is None or event_time < self.until)


class RoutingPlan(Record):
    """The write-ahead routing decision for one service-graph batch."""

    batch_id: int
    target_query: str
    target_topic: str
    cut: CutRoute | None = None
    late_before: int | None = None  # rows with event time before this are late
    ahead_after: int | None = None  # rows with event time after this are dead-lettered (max_time_jump)
    decided_at: int = Field(default_factory=now_ms)
    # Every graph that receives data rows, and for which event times (the target, at least).
    destinations: tuple[Destination, ...] = Field(min_length=1)
    # The schema the service graph checks each record against: the target version's (a JSON source only).
    checked_schema: str


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


class DiffExample(Record):
    """One value that differs between the current version and a shadow."""

    window_start: int
    window_end: int
    group: dict[str, Any]
    column: str
    current: Any
    shadow: Any


class ShadowDiff(Record):
    """How a shadow's output compares with the current version's, for the windows both closed since
    the shadow's start S (service_sink/diff.py)."""

    shadow_id: str
    since: int  # S
    closed_through: int  # windows ending at or before this were closed by both
    windows_compared: int = 0
    groups_compared: int = 0  # (window, group) results both versions have
    only_current: int = 0  # (window, group) results only the current version has
    only_shadow: int = 0  # ... only the shadow has
    ambiguous_groups: int = 0  # groups matched by the shared group columns to several rows on a side
    values_differ: int = 0  # value cells (shared columns) that differ beyond the tolerance
    columns_compared: tuple[str, ...] = ()
    group_columns: tuple[str, ...] = ()  # the group columns both versions have, matched by name
    group_columns_differ: bool = False
    tolerance: float = 1e-9
    examples: tuple[DiffExample, ...] = ()
    computed_at: int = Field(default_factory=now_ms)

    @property
    def identical(self) -> bool:
        return self.values_differ == 0 and self.only_current == 0 and self.only_shadow == 0
