"""The status document: what `hotswap status --json` prints and `Client.status()` returns.

Its fields are a contract for operators and their tools (docs/operations.md, "Status"); the JSON Schema in
docs/status.schema.json is generated from these models. Regenerate it after a change with
`python -m hotswap.contract.status > docs/status.schema.json` (or `make schema`); a unit test fails while
the committed schema is stale. Fields may be added; none is renamed or removed without a
changelog entry.

Times are epoch milliseconds (UTC), null where nothing has happened yet.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hotswap.contract.models import ExecutorPhase, GraphEngine, GraphState, QueryKind, ShadowDiff
from hotswap.contract.phases import SwapPhase
from hotswap.contract.reasons import ReasonCode


class StatusPart(BaseModel):
    # frozen: a status is a snapshot, not something to edit. extra="ignore": a document written by
    # a newer hotswap (with more fields) still reads here. Descriptions are given with Field, not as
    # attribute docstrings: pydantic would parse this file's source at every import, a cost every
    # `hotswap status` would pay.
    model_config = ConfigDict(frozen=True, extra="ignore")


class ExecutorStatus(StatusPart):
    """The executor acting on the namespace, as its lease and its recorded phase say."""

    holder: str | None = Field(
        description="The lease token of the executor holding it (host:pid:nonce:pid-space), or null when none does."
    )
    phase: ExecutorPhase = Field(
        description="The executor's lifecycle phase; `stopped` whenever nobody holds the lease."
    )
    since: int | None = Field(
        description="When the executor recorded that phase (epoch ms), or null if no executor ever ran here."
    )


class CurrentStatus(StatusPart):
    """The query that serves windows after every cut so far."""

    query_id: str
    started_at: int = Field(description="When it became the current query (epoch ms).")


class PhaseStatus(StatusPart):
    """One phase a swap went through."""

    name: SwapPhase
    at: int = Field(description="When the swap entered the phase (epoch ms).")


class SwapStatus(StatusPart):
    """One swap of the journal, in submission order."""

    id: str
    from_query: str | None = Field(description="The query it replaces; null until the executor has validated the swap.")
    to_query: str
    state: SwapPhase
    cut_window_end: int | None = Field(
        description="W: the old query answers windows ending at or before W, the new one those after it."
    )
    cut_batch: int | None = Field(description="The service-graph batch that recorded the cut.")
    old_window_ms: int | None
    new_window_ms: int | None
    old_slide_ms: int | None = Field(
        default=None,
        description="How often a window of the old query starts (its window size when tumbling); null until known.",
    )
    new_slide_ms: int | None = Field(
        default=None,
        description="How often a window of the new query starts (its window size when tumbling); null until validated.",
    )
    phases: list[PhaseStatus]
    error: str | None = Field(description="Why the swap failed, was stranded, rejected or aborted, in one line.")
    reason_code: ReasonCode | None = Field(
        default=None,
        description=(
            "The same, as a word a program can match (docs/reference.md, 'Reason codes'); "
            "null while nothing went wrong."
        ),
    )
    waiting_for: str | None = Field(
        description="What an unfinished swap waits for, in one line (the phase table's text, "
        "docs/swap-states.md); null once it has ended."
    )
    rollback_of: str | None = Field(description="The swap this one undoes (a swap back to that swap's previous query).")
    recovers: str | None = Field(
        default=None,
        description="The stranded swap whose input this one takes over (a rollback or fix forward of it).",
    )
    replaces: str | None = Field(
        default=None,
        description="The serving query, failed for good with no swap to fix, whose input this one takes over "
        "(`hotswap replace`).",
    )
    auto_rollback: bool = Field(
        default=False,
        description="Submitted with --auto-rollback: rolls back on its own if its new query fails "
        "for good after its cut.",
    )
    cause: str | None = Field(
        default=None, description="Why the executor queued this swap itself (an automatic rollback), in one line."
    )
    shadow: bool = Field(
        default=False, description="Submitted with --shadow: runs beside the current query until promoted."
    )
    shadow_since: int | None = Field(
        default=None, description="S: the shadow receives every row its windows ending after S need (event time)."
    )
    promote: bool = Field(default=False, description="`hotswap promote` was asked: the cut comes at the next batch.")
    diff: ShadowDiff | None = Field(
        default=None, description="The last `hotswap diff` of a shadow against the current version."
    )
    note: str | None = Field(
        description="For a rolled-back or fixed-forward swap: which windows kept its results, and who answers "
        "after them."
    )

    @property
    def is_recovery(self) -> bool:
        return self.recovers is not None or self.replaces is not None


class OwnerStatus(StatusPart):
    """One query version and the windows it answers: windows ending after `after` and at or before
    `through` (null: unbounded)."""

    query_id: str
    after: int | None
    through: int | None
    # Left out (not null) for the version that answered before any cut, as the document always had it.
    swap_id: str | None = Field(
        default=None,
        exclude_if=lambda swap_id: swap_id is None,
        description="The swap whose cut gave it these windows; absent for the version that answered before any cut.",
    )


class PartitionStatus(StatusPart):
    """One source partition of the service graph."""

    window_end: int | None = Field(description="End of the largest window it has routed.")
    event_time: int | None = Field(description="Largest event time it has routed.")
    offset: int = Field(description="Largest source offset it has read (-1: none yet).")
    idle: bool = Field(description="Set aside: no new rows for `idle_timeout`, so it does not hold the watermark back.")


class ServiceStatus(StatusPart):
    """The service graph after its last routed batch."""

    watermark: int | None = Field(description="The service watermark every execution graph closes its windows on.")
    last_batch: int = Field(description="The last routed batch (-1: none yet).")
    partitions: dict[str, PartitionStatus] = Field(description="By source partition number, in ascending order.")
    stalled_batches: int = Field(
        default=0, ge=0, description="Its batches cancelled for running longer than batch_stall_timeout."
    )
    skipped_reads: int = Field(
        default=0,
        ge=0,
        description="Its batches replayed because Spark's read skipped source records that Kafka still held.",
    )


class ProgressStatus(StatusPart):
    """What the service sink last reported about an execution graph."""

    batch_id: int
    watermark: int | None
    committed_batch: int = Field(description="The last batch whose commit Spark recorded in the graph's checkpoint.")
    committed_watermark: int | None = Field(
        description="The watermark of the committed batch: the graph has emitted every window ending at or before it."
    )
    num_input_rows: int = Field(description="Rows in the last reported batch.")


class GraphStatus(StatusPart):
    """One execution graph: a query version, its input topic and its Spark query."""

    state: GraphState = Field(
        description="starting (recorded, its query not running yet), running, failed (failed for good, yet it "
        "keeps the windows it owns: a rollback, a fix or a restart takes it over), retired (served, then stopped "
        "once it emitted its windows) or discarded (never served: its swap ended before the cut)."
    )
    topic: str = Field(description="Its input topic: the buffer the service graph fills for it.")
    window_ms: int
    slide_ms: int | None = Field(
        default=None, description="How often a window starts: its size for tumbling windows, less for sliding ones."
    )
    kind: QueryKind
    started_at: int | None
    retired_at: int | None = Field(description="When it was retired or discarded.")
    progress: ProgressStatus | None = Field(description="Null until the graph has reported a batch.")
    source_schema: str = Field(description="The schema this version reads, as Spark DDL.")
    routed_records: int = Field(default=0, ge=0, description="Source rows the service graph routed to it.")
    engine: GraphEngine = Field(
        default=GraphEngine.STATEFUL,
        description="How it computes its windows: stateful (a Spark streaming aggregation) or closing (each window "
        "once, as a batch, when every partition's marker has passed it).",
    )
    partitions: int = Field(default=1, ge=1, description="Partitions of its input topic, each read by one Spark task.")
    stalled_batches: int = Field(
        default=0, ge=0, description="Its batches cancelled for running longer than batch_stall_timeout."
    )
    skipped_batches: int = Field(
        default=0,
        ge=0,
        description="Batches it failed on for good and went on without, their rows in the dead-letter topic "
        "(poison_batches = dead_letter; dead_letters.poison_batch counts the rows).",
    )


class Status(StatusPart):
    """The status document of one namespace."""

    namespace: str
    executor: ExecutorStatus
    current: CurrentStatus | None = Field(description="Null until an executor has started a query in the namespace.")
    swaps: list[SwapStatus]
    owners: list[OwnerStatus] = Field(description="Which version answers which windows, oldest first.")
    service: ServiceStatus
    graphs: dict[str, GraphStatus] = Field(description="By query id.")
    late_records: int = Field(ge=0, description="Rows older than the service watermark, sent to the late topic.")
    dead_letter_records: int = Field(ge=0, description="Malformed or far-future rows, sent to the dead-letter topic.")
    expired_records: int = Field(
        ge=0, description="Source rows Kafka's retention deleted before the service graph read them."
    )
    dead_letters: dict[str, int] = Field(
        default_factory=dict,
        description="Dead-lettered rows by reason code (not_json, not_avro, bad_magic_byte, type_mismatch, "
        "missing_field, missing_event_time, bad_event_time, event_time_out_of_range, too_far_ahead, empty_record, "
        "poison_batch).",
    )
    source: str | None = Field(
        default=None,
        description="How the service graph reads the source topic: format, schema and event time (null until the "
        "namespace's first executor has started).",
    )


def json_schema() -> dict[str, Any]:
    """The published schema. Serialization mode: it describes the JSON as printed, where every
    field is present (null where it has no value)."""
    return Status.model_json_schema(mode="serialization")


def json_schema_text() -> str:
    """docs/status.schema.json, byte for byte."""
    return json.dumps(json_schema(), indent=2) + "\n"


if __name__ == "__main__":
    print(json_schema_text(), end="")
