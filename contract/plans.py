"""A dry run's request and its plan (`hotswap submit FILE --dry-run`).

The CLI cannot validate a query: that needs Spark, which only the executor has. So it leaves a
request in Redis, with a time-to-live, and the executor's loop answers it with a plan, also with a
time-to-live. Nothing else is written: not the journal, not a graph record, not a topic.
"""

from __future__ import annotations

from pydantic import Field

from hotswap.contract.models import QuerySource, Record, now_ms
from hotswap.contract.reasons import ReasonCode

DRY_RUN_TTL_S = 120  # a request nobody answered, or an answer nobody read, is gone after this


class DryRunRequest(Record):
    id: str
    source: QuerySource
    at: int = Field(default_factory=now_ms)


class DryRunPlan(Record):
    """What a submit of the query would do now. Times are epoch ms (event time for W and the floor)."""

    request_id: str
    query: str = Field(description="The query's name (its file name unless --name says otherwise).")
    valid: bool = Field(description="Whether the query passed validation against the running query.")
    reason: str | None = Field(default=None, description="Why it would be rejected (one line), when not valid.")
    reason_code: ReasonCode | None = Field(
        default=None, description="The machine-readable form of the reason (docs/reference.md, 'Reason codes')."
    )
    window_ms: int | None = Field(default=None, description="The window size learned from its plan.")
    slide_ms: int | None = Field(default=None, description="The slide of a sliding window (null: tumbling).")
    group_columns: tuple[str, ...] = Field(default=(), description="Output columns that make up the result key.")
    columns: tuple[str, ...] = Field(default=(), description="Every output column, in order.")
    schema_ddl: str | None = Field(default=None, description="The schema the query reads (its `events`), as DDL.")
    replaces: str | None = Field(default=None, description="The query it would replace when its turn came.")
    replaces_window_ms: int | None = None
    cut_window_end: int | None = Field(
        default=None,
        description="W: the boundary a cut taken now would pick (event time). Null before the service graph "
        "has routed a row.",
    )
    floor: int | None = Field(
        default=None,
        description="W plus the allowed lateness: the service watermark must pass it before the old query "
        "drains, so no swap taken now completes before event time reaches it.",
    )
    lateness_ms: int | None = None
    service_watermark: int | None = None
    ahead: tuple[str, ...] = Field(
        default=(), description="Swaps queued or in progress ahead of it (ids, oldest first); empty when none."
    )
    answered_at: int = Field(default_factory=now_ms)
