"""What holds a queued swap back, and what an unfinished swap waits for: one rule, read by the
executor (to decide) and by `status` (to say it). Pure functions over records; nothing here needs
Spark. The texts themselves are the phase table's (contract/phases.py)."""

from __future__ import annotations

from collections.abc import Mapping

from hotswap.contract.journal import SwapRecord, active_swap
from hotswap.contract.models import CurrentQuery, GraphRecord, GraphState, ServiceState, now_ms
from hotswap.contract.phases import Wait, WaitFacts, wait_text


def graphs_to_start(current: CurrentQuery | None, swaps: list[SwapRecord]) -> list[str]:
    """The graphs `start_blocker` reads: the current one and the old graphs of stranded swaps."""
    named = [current.query_id] if current else []
    return named + [s.from_query for s in swaps if s.state.is_stranded and s.from_query]


def start_blocker(
    current: CurrentQuery | None,
    graphs: Mapping[str, GraphRecord],
    swaps: list[SwapRecord],
    candidate: SwapRecord | None = None,
) -> str | None:
    """Why no queued swap (or `candidate`) may start now, or None.

    A stranded swap holds every other swap back until a recovery takes it over (only that recovery
    may start), and its old graph must have emitted its windows through the cut first. Otherwise the
    query serving the windows after the last cut must be running: a swap replaces it, and its old
    graph must drain.
    """
    recovering = candidate is not None and candidate.is_recovery
    for swap in swaps:
        if not swap.state.is_stranded:
            continue
        if candidate is None or candidate.recovers != swap.id:
            return (
                f"swap {swap.id} is stranded (its query {swap.to_query} failed for good after its cut): "
                f"`hotswap rollback {swap.id}` or `hotswap submit FILE --fix {swap.id}` takes it over first"
            )
        old = graphs.get(swap.from_query or "")
        if old is not None and old.state is GraphState.RUNNING:
            return f"query {old.query_id} is still emitting its windows through the cut of swap {swap.id}"
    record = graphs.get(current.query_id) if current else None
    if record is not None and record.state is not GraphState.RUNNING and not recovering:
        return (
            f"query {record.query_id} serves the windows after the last cut but is {record.state}: `hotswap "
            "replace FILE` takes over its input, or fix its cause and restart `hotswap run`, which resumes it"
        )
    return None


def turn(swap: SwapRecord, swaps: list[SwapRecord], blocker: str | None) -> str:
    """What a validated swap waits for before it deploys."""
    active = active_swap(swaps)
    if active is not None and active.id != swap.id:
        return f"swap {active.id} ahead of it to finish"
    return blocker or "the executor's next step"


def waiting_for(
    swap: SwapRecord,
    swaps: list[SwapRecord],
    service: ServiceState,
    graphs: Mapping[str, GraphRecord],
    committed: Mapping[str, int | None],
    blocker: str | None,
) -> str | None:
    """What an unfinished swap waits for, in one line (the phase table's text); None once it has ended."""
    wait = swap.wait
    if wait is None:
        return None
    old = graphs.get(swap.from_query or "")
    facts = WaitFacts(
        turn=turn(swap, swaps, blocker) if wait is Wait.TURN else "",
        watermark=service.watermark,
        idle=tuple(service.idle_partitions),
        old_watermark=committed.get(swap.from_query or ""),
        old_failed=old is not None and old.state is GraphState.FAILED,
        elapsed_ms=now_ms() - swap.phases[-1].at if swap.phases else None,
        taker=next((s.id for s in swaps if s.recovers == swap.id and s.state.is_in_flight), None),
    )
    return wait_text(
        wait, swap_id=swap.id, to_query=swap.to_query, from_query=swap.from_query, cut=swap.cut_window_end, facts=facts
    )
