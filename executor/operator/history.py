"""`hotswap history`: past swaps with each phase's duration, W, the outcome and, for a failure,
its reason and reason code. Derived from the status document (the journal), never stored apart."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hotswap.contract.status import Status, SwapStatus


class PhaseSpan(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    at: int = Field(description="When the swap entered the phase (epoch ms).")
    seconds: float | None = Field(
        description="How long the swap stayed in it: until its next phase, or until now for the phase it is in; "
        "null for the phase it ended in."
    )


class SwapHistory(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    from_query: str | None
    to_query: str
    state: str = Field(description="Its phase now: for a swap that ended, its outcome.")
    ended: bool = Field(description="Whether the swap reached a terminal phase.")
    submitted_at: int | None
    ended_at: int | None = Field(description="When it reached its terminal phase (epoch ms), null while it runs.")
    seconds: float | None = Field(description="From submitted to its end (or to now while it runs).")
    cut_window_end: int | None = Field(description="W (event time, epoch ms); null if it never reached its cut.")
    phases: list[PhaseSpan]
    error: str | None = Field(description="Why it failed, was rejected or aborted (one line).")
    reason_code: str | None = Field(description="The machine-readable form of `error`, where the journal has one.")
    rollback_of: str | None


def swap_history(swap: SwapStatus, now_ms: int) -> SwapHistory:
    spans: list[PhaseSpan] = []
    for i, phase in enumerate(swap.phases):
        if i + 1 < len(swap.phases):
            seconds: float | None = (swap.phases[i + 1].at - phase.at) / 1000
        else:
            seconds = None if swap.state.is_terminal else max(0, now_ms - phase.at) / 1000
        spans.append(PhaseSpan(name=str(phase.name), at=phase.at, seconds=seconds))
    submitted = swap.phases[0].at if swap.phases else None
    ended_at = _ended_at(swap)
    end = ended_at if ended_at is not None else now_ms
    return SwapHistory(
        id=swap.id,
        from_query=swap.from_query,
        to_query=swap.to_query,
        state=str(swap.state),
        ended=swap.state.is_terminal,
        submitted_at=submitted,
        ended_at=ended_at,
        seconds=None if submitted is None else max(0, end - submitted) / 1000,
        cut_window_end=swap.cut_window_end,
        phases=spans,
        error=swap.error,
        reason_code=swap.reason_code,
        rollback_of=swap.rollback_of,
    )


def _ended_at(swap: SwapStatus) -> int | None:
    """When the swap first reached a terminal phase (a completed swap rolled back later ended when
    it completed)."""
    return next((p.at for p in swap.phases if p.name.is_terminal), None)


def history(status: Status, now_ms: int, limit: int | None = None) -> list[SwapHistory]:
    """The swaps of the journal, newest first; `limit` keeps the newest N."""
    entries = [swap_history(s, now_ms) for s in reversed(status.swaps)]
    return entries if limit is None else entries[:limit]
