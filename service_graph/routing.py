"""Routing decisions, free of Spark and Redis so they can be tested on their own.

A batch is routed by a plan decided once, written down before any row moves, and reused as-is
when Spark replays the batch. Rows are classified in this order: malformed or too far ahead
(dead letter), late, then data: to the old graph if its event time is before the cut W, and to the
target graph if it is at or after the first row the target's windows after W need (W itself for
tumbling windows; W - size + slide for sliding ones, so rows in between go to both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import CutRoute, Destination, GraphRecord, NodePosition, RoutingPlan, ServiceState
from hotswap.contract.windows import Windowing, cut_boundary, first_row_needed, promotion_boundary
from hotswap.service_graph.errors import NoTargetGraph


@dataclass(frozen=True)
class PartitionBatchStats:
    """What one source partition contributed to one batch."""

    partition: int
    max_offset: int
    max_event_time: int | None  # over rows routed to a graph (not malformed, not late)
    max_window_end: int | None
    late: int
    dead_letter: int
    min_offset: int | None = None
    rows: int = 0  # records of the partition the batch read


@dataclass(frozen=True)
class Idleness:
    """Which partitions are set aside as idle, and for how long the whole source has been quiet.

    Measured by the caller on a monotonic clock; `quiet_ms` is set only when every partition is
    idle, and then the watermark advances with it (processing time since the last row).
    """

    idle: frozenset[str] = field(default_factory=frozenset)
    quiet_ms: int | None = None


@dataclass(frozen=True)
class Marker:
    """A watermark marker for one execution graph's topic: Spark's watermark there becomes `watermark`."""

    query_id: str
    topic: str
    watermark: int


def routing_swap(swaps: Iterable[SwapRecord]) -> SwapRecord | None:
    """The swap whose cut shapes routing: the latest one past its cut, unless a later swap has
    completed since. A stranded swap keeps its cut: its new graph still owns the windows after W
    (their rows wait in its topic) and the old graph those up to W.

    The open swaps (the journal's index) give the same answer as all of them: a swap that ended left
    the index, and a stranded one is relabelled in the very write that completes its recovery."""
    chosen: SwapRecord | None = None
    for swap in swaps:
        if swap.state.is_past_cut:
            chosen = swap
        elif swap.state.is_done:
            chosen = None
    return chosen


def decide_cut(state: ServiceState, swap: SwapRecord, rolls_back: bool = False) -> int:
    """W for a swap being cut now: the first boundary of both versions' grids at or after the
    largest window any partition has routed, late enough that a sliding new version receives every
    row of its windows after W (contract.windows.cut_boundary states the rule)."""
    if swap.old_window_ms is None or swap.new_window_ms is None:
        raise NoTargetGraph(f"swap {swap.id} has no window sizes recorded; it cannot be cut")
    old = Windowing.of(swap.old_window_ms, swap.old_slide_ms)
    new = Windowing.of(swap.new_window_ms, swap.new_slide_ms)
    if swap.state is SwapPhase.SHADOWING and swap.shadow_since is not None:
        # A promoted shadow: it holds every row from S on already (contract.windows.promotion_boundary).
        return promotion_boundary(state.max_window_end, old, new, swap.shadow_since, state.watermark)
    # A fresh graph, or a shadow's start S: the first instant a graph deployed now could take over.
    return cut_boundary(state.max_window_end, old, new, state.watermark, rolls_back=rolls_back and not swap.shadow)


def shadowing_swap(swaps: Iterable[SwapRecord]) -> SwapRecord | None:
    """The shadow that receives rows beside the current query now: a swap in `shadowing` (S recorded),
    promoted or not yet."""
    return next((s for s in swaps if s.state is SwapPhase.SHADOWING and s.shadow_since is not None), None)


def plan_batch(
    batch_id: int,
    state: ServiceState,
    current: GraphRecord | None,
    swap: SwapRecord | None,
    graphs: Mapping[str, GraphRecord],
    *,
    ahead_after: int | None = None,
    shadow: SwapRecord | None = None,
) -> RoutingPlan:
    """The plan for a batch, given a swap whose cut (if any) is already recorded.

    `ahead_after` is the latest event time routed as data; later ones are dead-lettered. `shadow`,
    a swap in `shadowing`, receives every row from the first its windows after S need, beside the
    rest of the plan.
    """
    cut = None
    old_partitions = 1
    if swap is not None and swap.state.is_past_cut:
        target = graphs.get(swap.to_query)
        old = graphs.get(swap.from_query or "")
        if target is None or old is None or swap.cut_window_end is None:
            raise NoTargetGraph(f"swap {swap.id} is past its cut but its graphs are not recorded")
        old_partitions = old.partitions
        # A recovery's cut only says where a failed query stopped: no row goes to that query again.
        if swap.state.is_draining and not swap.is_recovery:
            cut = CutRoute(swap_id=swap.id, boundary=swap.cut_window_end, old_query=old.query_id, old_topic=old.topic)
    elif current is None:
        raise NoTargetGraph("no current execution graph: start the executor with `hotswap run --query FILE`")
    else:
        target = current
    destinations = [Destination(query_id=target.query_id, topic=target.topic, partitions=target.partitions)]
    if cut is not None:
        # The target's first window after W starts at W - size + slide (W for tumbling windows): the
        # rows from there up to W go to both graphs. The cut rule made sure none was routed before it.
        # A promoted shadow has received rows since its start S (<= W): it keeps receiving them from there.
        start = cut.boundary if swap is None or swap.shadow_since is None else min(swap.shadow_since, cut.boundary)
        since = first_row_needed(start, target.windowing)
        if swap is not None and swap.buffer_from is not None:
            since = min(since, swap.buffer_from)  # what its rollback would need, kept in its buffer
        destinations = [
            Destination(query_id=cut.old_query, topic=cut.old_topic, until=cut.boundary, partitions=old_partitions),
            Destination(
                query_id=target.query_id,
                topic=target.topic,
                since=since,
                partitions=target.partitions,
            ),
        ]
    shadow_graph = graphs.get(shadow.to_query) if shadow is not None and shadow.shadow_since is not None else None
    if shadow is not None and shadow.shadow_since is not None and shadow_graph is not None:
        since = first_row_needed(shadow.shadow_since, shadow_graph.windowing)
        destinations.append(
            Destination(
                query_id=shadow_graph.query_id,
                topic=shadow_graph.topic,
                since=since,
                partitions=shadow_graph.partitions,
            )
        )
    return RoutingPlan(
        batch_id=batch_id,
        target_query=target.query_id,
        target_topic=target.topic,
        cut=cut,
        late_before=state.watermark,
        ahead_after=ahead_after,
        destinations=tuple(destinations),
        # Records are checked against the schema of the version rows after the cut go to: schemas
        # only change compatibly through a swap, so the newest one reads every field (README, "Your own topic").
        checked_schema=target.reads.schema_ddl,
    )


def time_jump_limit(watermark: int | None, batch_median: int | None, max_time_jump_ms: int) -> int | None:
    """The latest event time accepted as data: `max_time_jump` ahead of the service watermark.

    Before the first watermark exists (the first batch of a namespace) the batch's median event
    time stands in for it, so one far-future event cannot set the first watermark and cut either.
    """
    reference = watermark if watermark is not None else batch_median
    return None if reference is None else reference + max_time_jump_ms


def graph_markers(plan: RoutingPlan, watermark: int | None) -> list[Marker]:
    """The markers to write after a batch (or a tick) routed by `plan`, given the new watermark.

    Spark drops rows with event time at or below its watermark, and the next batch routes rows
    with event time at or above the service watermark as on time: so Spark's watermark is set
    1 ms below it. The old graph of a cut receives nothing once the watermark reaches W, so its
    watermark may go to W exactly, which closes its last windows.
    """
    if watermark is None:
        return []
    markers = []
    for destination in plan.destinations:
        position = watermark - 1
        if destination.until is not None and watermark >= destination.until:
            # It receives nothing at or after `until` (W): its watermark stops there, which closes
            # its last windows and never a window it does not own.
            position = destination.until
        markers.append(Marker(destination.query_id, destination.topic, position))
    return markers


def advance_state(
    state: ServiceState,
    batch_id: int,
    stats: Iterable[PartitionBatchStats],
    *,
    now_ms: int,
    lateness_ms: int,
    idleness: Idleness,
) -> ServiceState:
    """Node positions and the service watermark after a batch (or a tick, with no stats).

    Positions only grow, so applying a replayed batch twice changes nothing. The watermark never
    moves backwards (see `service_watermark`).
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
    partitions = {p: n.changed(idle=p in idleness.idle) for p, n in partitions.items()}
    return ServiceState(
        last_batch=max(state.last_batch, batch_id),
        watermark=service_watermark(partitions, state.watermark, lateness_ms, idleness),
        partitions=partitions,
    )


def service_watermark(
    partitions: Mapping[str, NodePosition], previous: int | None, lateness_ms: int, idleness: Idleness
) -> int | None:
    """The minimum event-time position over partitions that are not idle, minus the lateness.

    Idle partitions are set aside. When every partition is idle, the watermark is the largest
    position minus the lateness, advanced by the processing time since the last row, so a quiet
    source still closes its last windows. It never moves backwards.
    """
    positions = {p: n.event_time for p, n in partitions.items() if n.event_time is not None}
    active = [t for p, t in positions.items() if p not in idleness.idle]
    if active:
        candidate = min(active) - lateness_ms
    elif positions and idleness.quiet_ms is not None:
        candidate = max(positions.values()) - lateness_ms + idleness.quiet_ms
    else:
        return previous
    return candidate if previous is None else max(previous, candidate)


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


class IdleClock:
    """When each source partition last brought rows, on a monotonic clock.

    It starts afresh with the process: after a restart every partition counts as active until it
    has been quiet for `idle_timeout` again, so a backlog waiting in Kafka is never taken for
    silence. With `idle_timeout` off no partition is ever idle.
    """

    def __init__(self, idle_timeout_ms: int | None, started_at: float) -> None:
        self._timeout_s = None if idle_timeout_ms is None else idle_timeout_ms / 1000
        self._started_at = started_at
        self._last_rows: dict[str, float] = {}
        self._last_any = started_at

    def rows_seen(self, partitions: Iterable[str], now: float) -> None:
        for partition in partitions:
            self._last_rows[partition] = now
            self._last_any = now

    def quiet(self, partitions: Iterable[str], now: float) -> frozenset[str]:
        """Partitions without rows for idle_timeout (candidates: the caller checks Kafka has none waiting)."""
        if self._timeout_s is None:
            return frozenset()
        timeout = self._timeout_s
        return frozenset(p for p in partitions if now - self._last_rows.get(p, self._started_at) >= timeout)

    def idleness(self, partitions: Iterable[str], idle: frozenset[str], now: float) -> Idleness:
        known = set(partitions)
        every_one = bool(known) and known <= idle
        return Idleness(idle=idle, quiet_ms=int((now - self._last_any) * 1000) if every_one else None)
