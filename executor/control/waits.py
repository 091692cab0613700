"""What an unfinished swap waits for: one rule, read by the executor (to decide) and by `status`
(to say it). Pure functions over records; nothing here needs Spark."""

from __future__ import annotations

from datetime import UTC, datetime

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import CurrentQuery, GraphProgress, GraphRecord, GraphState, ServiceState


def start_blocker(
    current: CurrentQuery | None,
    graphs: dict[str, GraphRecord],
    swaps: list[SwapRecord],
    candidate: SwapRecord | None = None,
) -> str | None:
    """Why no queued swap (or `candidate`) may start now, or None.

    The query serving the windows after the last cut must be running (a swap replaces it and its
    old graph must drain), unless the candidate recovers that very query from its failure; and the
    old graph of a swap that failed after its cut must have emitted its windows through that cut
    first.
    """
    record = graphs.get(current.query_id) if current else None
    recovering = candidate is not None and candidate.recovers is not None
    if record is not None and record.state is not GraphState.RUNNING and not recovering:
        return (
            f"query {record.query_id} serves the windows after the last cut but is {record.state}; fix its cause "
            "and restart `hotswap run`, or take over its buffer: `hotswap rollback ID` or `submit FILE --fix ID` "
            "on the swap that failed"
        )
    for swap in swaps:
        if swap.state is SwapPhase.FAILED and swap.cut_window_end is not None and swap.from_query:
            old = graphs.get(swap.from_query)
            if old is not None and old.state is GraphState.RUNNING:
                return f"query {old.query_id} is still emitting its windows through the cut of swap {swap.id}"
    return None


def recovered_queries(swaps: list[SwapRecord]) -> set[str]:
    """Queries that failed for good after their cut and that a recovery (rollback or fix forward)
    has claimed: they must never run again, whatever state the recovery is in."""
    by_id = {s.id: s for s in swaps}
    out = set()
    for swap in swaps:
        failed = by_id.get(swap.recovers or "")
        if failed is not None and not swap.ended_before_cut:
            out.add(failed.to_query)
    return out


def waiting_for(
    swap: SwapRecord,
    swaps: list[SwapRecord],
    service: ServiceState,
    progress: dict[str, GraphProgress | None],
    blocker: str | None,
) -> str | None:
    """What an unfinished swap waits for, in one line; None once it has ended."""
    state = swap.state
    if state.is_terminal:
        return None
    if state is SwapPhase.SUBMITTED:
        return "validation by the executor"
    if state is SwapPhase.VALIDATED:
        position = next((i for i, s in enumerate(swaps) if s.id == swap.id), 0)
        ahead = [s.id for s in swaps[:position] if not s.state.is_terminal]
        if ahead:
            return f"swap {ahead[0]} ahead of it to finish"
        return blocker or "its new graph to start"
    if state is SwapPhase.DEPLOYED:
        if swap.recovers is not None:
            return "the executor to record where the failed query stopped"
        return "the cut at the service graph's next batch or tick"
    w = swap.cut_window_end
    if state is SwapPhase.CUT:
        idle = service.idle_partitions
        return f"drain: service watermark {clock(service.watermark)} < W {clock(w)}" + (
            f"; partitions {', '.join(idle)} idle" if idle else ""
        )
    if state is SwapPhase.DRAINING:
        old = progress.get(swap.from_query or "")
        reached = old.committed_watermark if old else None
        return f"{swap.from_query} to emit its windows through W {clock(w)} (its watermark {clock(reached)})"
    return f"{swap.from_query} to be retired"


def clock(ms: int | None) -> str:
    """A time of day for one-line messages (UTC, with milliseconds)."""
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
