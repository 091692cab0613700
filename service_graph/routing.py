"""Routing decisions, free of Spark and Redis so they can be tested on their own.

A batch is routed by a plan decided once, written down before any row moves, and reused as-is
when Spark replays the batch. Rows are classified in this order: malformed, late, owned by the
old graph (event time before the cut W), owned by the target graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contract.journal import SwapPhase, SwapRecord
from contract.models import CutRoute, GraphRecord, NodePosition, RoutingPlan, ServiceState
from contract.windows import cut_boundary
from service_graph.errors import NoTargetGraph

# Phases in which rows before the cut still flow to the old graph.
ROUTES_TO_OLD = frozenset({SwapPhase.CUT, SwapPhase.DRAINING, SwapPhase.DRAINED})


@dataclass(frozen=True)
class PartitionBatchStats:
    """What one source partition contributed to one batch."""

    partition: int
    max_offset: int
    max_event_time: int | None  # over rows routed to a graph (not malformed, not late)
    max_window_end: int | None
    late: int
    dead_letter: int


def active_swap(swaps: Iterable[SwapRecord]) -> SwapRecord | None:
    """The one swap in progress past validation, if any (swaps run one at a time, in order)."""
    for swap in swaps:
        if not swap.state.is_terminal and swap.state not in (SwapPhase.SUBMITTED, SwapPhase.VALIDATED):
            return swap
    return None


def failed_after_cut(swap: SwapRecord) -> bool:
    return swap.state is SwapPhase.FAILED and swap.cut_window_end is not None


def routing_swap(swaps: Iterable[SwapRecord]) -> SwapRecord | None:
    """The swap whose cut shapes routing: the latest one past its cut, unless a later swap has
    completed since. A swap that failed after its cut keeps its cut: its new graph still owns the
    windows after W (their rows wait in its topic) and the old graph those up to W."""
    chosen: SwapRecord | None = None
    for swap in swaps:
        if swap.state.is_past_cut or failed_after_cut(swap):
            chosen = swap
        elif swap.state is SwapPhase.COMPLETED:
            chosen = None
    return chosen


def decide_cut(state: ServiceState, swap: SwapRecord) -> int:
    """W for a swap being cut now: the first common boundary at or after the largest window any
    partition has routed."""
    if swap.old_window_ms is None or swap.new_window_ms is None:
        raise NoTargetGraph(f"swap {swap.id} has no window sizes recorded; it cannot be cut")
    return cut_boundary(state.max_window_end or 0, swap.old_window_ms, swap.new_window_ms)


def plan_batch(
    batch_id: int,
    state: ServiceState,
    current: GraphRecord | None,
    swap: SwapRecord | None,
    graphs: Mapping[str, GraphRecord],
) -> RoutingPlan:
    """The plan for a batch, given a swap whose cut (if any) is already recorded."""
    late_before = state.watermark
    if swap is not None and (swap.state.is_past_cut or failed_after_cut(swap)):
        target = graphs.get(swap.to_query)
        old = graphs.get(swap.from_query or "")
        if target is None or old is None or swap.cut_window_end is None:
            raise NoTargetGraph(f"swap {swap.id} is past its cut but its graphs are not recorded")
        cut = None
        if swap.state in ROUTES_TO_OLD or failed_after_cut(swap):
            cut = CutRoute(swap_id=swap.id, boundary=swap.cut_window_end, old_query=old.query_id, old_topic=old.topic)
        return RoutingPlan(
            batch_id=batch_id, target_query=target.query_id, target_topic=target.topic, cut=cut, late_before=late_before
        )
    if current is None:
        raise NoTargetGraph("no current execution graph: start the executor with `hotswap run --query FILE`")
    return RoutingPlan(
        batch_id=batch_id, target_query=current.query_id, target_topic=current.topic, late_before=late_before
    )


def advance_state(
    state: ServiceState,
    batch_id: int,
    stats: Iterable[PartitionBatchStats],
    *,
    now_ms: int,
    lateness_ms: int,
    idle_timeout_ms: int,
) -> ServiceState:
    """Node positions and the service watermark after a batch.

    Positions only grow, so applying a replayed batch twice changes nothing. The watermark is
    the minimum event-time position over partitions that are not idle, minus the allowed
    lateness; a partition with no rows for `idle_timeout_ms` stops holding it back. It never
    moves backwards.
    """
    partitions: dict[str, NodePosition] = dict(state.partitions)
    for s in stats:
        old = partitions.get(str(s.partition), NodePosition())
        brought_rows = s.max_event_time is not None
        partitions[str(s.partition)] = NodePosition(
            window_end=_max(old.window_end, s.max_window_end),
            event_time=_max(old.event_time, s.max_event_time),
            offset=max(old.offset, s.max_offset),
            last_data_at=now_ms if brought_rows else old.last_data_at,
        )
    return ServiceState(
        last_batch=max(state.last_batch, batch_id),
        watermark=service_watermark(partitions, state.watermark, now_ms, lateness_ms, idle_timeout_ms),
        partitions=partitions,
    )


def service_watermark(
    partitions: Mapping[str, NodePosition],
    previous: int | None,
    now_ms: int,
    lateness_ms: int,
    idle_timeout_ms: int,
) -> int | None:
    with_data = [p for p in partitions.values() if p.event_time is not None]
    active = [p for p in with_data if now_ms - p.last_data_at <= idle_timeout_ms]
    if not active:
        return previous
    candidate = min(p.event_time for p in active if p.event_time is not None) - lateness_ms
    return candidate if previous is None else max(previous, candidate)


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def marker_event_time(boundary: int, old_watermark_delay_ms: int) -> int:
    """Event time of the end-of-window marker: once the old query has read it, its watermark
    (max event time minus its delay) is past W, so its last windows close."""
    return boundary + old_watermark_delay_ms + 1
