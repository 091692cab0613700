import pytest

from contract.journal import SwapPhase, SwapRecord
from contract.models import GraphRecord, NodePosition, QueryKind, QuerySource, ServiceState
from service_graph.errors import NoTargetGraph
from service_graph.routing import (
    PartitionBatchStats,
    active_swap,
    advance_state,
    decide_cut,
    marker_event_time,
    plan_batch,
)

T0 = 1_700_000_000_000


def graph(query_id: str, window_ms: int = 10_000) -> GraphRecord:
    source = QuerySource(name=query_id, kind=QueryKind.SQL, text="SELECT 1")
    return GraphRecord(
        query_id=query_id, source=source, window_ms=window_ms, watermark_delay_ms=2_000, topic=f"t.{query_id}"
    )


def swap(state: SwapPhase, cut: int | None = None) -> SwapRecord:
    return SwapRecord(
        id="s1",
        from_query="old",
        to_query="new",
        state=state,
        cut_window_end=cut,
        old_window_ms=10_000,
        new_window_ms=30_000,
    )


GRAPHS = {"old": graph("old"), "new": graph("new", 30_000)}


def state_with(*ends: int) -> ServiceState:
    return ServiceState(
        last_batch=3,
        watermark=T0,
        partitions={str(i): NodePosition(window_end=e, event_time=e - 1, offset=10) for i, e in enumerate(ends)},
    )


def test_without_a_swap_every_row_goes_to_the_current_graph() -> None:
    plan = plan_batch(4, state_with(T0 + 10_000), GRAPHS["old"], None, GRAPHS)
    assert plan.target_topic == "t.old"
    assert plan.cut is None
    assert plan.late_before == T0


def test_cut_is_the_maximum_window_across_partitions_rounded_to_the_common_boundary() -> None:
    state = state_with(T0 + 10_000, T0 + 40_000, T0 + 20_000)
    w = decide_cut(state, swap(SwapPhase.DEPLOYED))
    # The first multiple of 30 s (and so of 10 s) at or after the largest window end, T0 + 40 s.
    assert w == -(-(T0 + 40_000) // 30_000) * 30_000
    assert T0 + 40_000 <= w < T0 + 70_000


def test_after_the_cut_rows_before_w_go_old_and_later_rows_go_new() -> None:
    cut = T0 + 60_000
    plan = plan_batch(5, state_with(T0), GRAPHS["old"], swap(SwapPhase.CUT, cut), GRAPHS)
    assert plan.target_topic == "t.new"
    assert plan.cut is not None
    assert (plan.cut.boundary, plan.cut.old_topic) == (cut, "t.old")


def test_once_retired_the_old_graph_receives_nothing() -> None:
    plan = plan_batch(9, state_with(T0), GRAPHS["old"], swap(SwapPhase.RETIRED, T0 + 60_000), GRAPHS)
    assert plan.target_topic == "t.new"
    assert plan.cut is None


def test_a_swap_past_its_cut_without_graph_records_is_an_error() -> None:
    with pytest.raises(NoTargetGraph):
        plan_batch(1, state_with(T0), None, swap(SwapPhase.CUT, T0), {})


def test_no_current_graph_and_no_swap_is_an_error_naming_the_fix() -> None:
    with pytest.raises(NoTargetGraph, match="hotswap run"):
        plan_batch(1, ServiceState(), None, None, {})


def test_active_swap_skips_queued_and_ended_swaps() -> None:
    done = swap(SwapPhase.COMPLETED)
    queued = swap(SwapPhase.VALIDATED).model_copy(update={"id": "s2"})
    running = swap(SwapPhase.DRAINING).model_copy(update={"id": "s3"})
    assert active_swap([done, queued, running]) == running
    assert active_swap([done, queued]) is None


def stats(partition: int, ts: int | None, offset: int = 5) -> PartitionBatchStats:
    end = None if ts is None else (ts // 10_000) * 10_000 + 10_000
    return PartitionBatchStats(partition, offset, ts, end, late=0, dead_letter=0)


def test_watermark_is_the_slowest_active_partition_minus_lateness() -> None:
    state = advance_state(
        ServiceState(), 0, [stats(0, T0 + 9_000), stats(1, T0 + 4_000)], now_ms=1, lateness_ms=2_000, idle_timeout_ms=10
    )
    assert state.watermark == T0 + 2_000
    assert state.partitions["0"].window_end == T0 + 10_000


def test_an_idle_partition_stops_holding_the_watermark_back() -> None:
    first = advance_state(
        ServiceState(), 0, [stats(0, T0 + 1_000), stats(1, T0 + 1_000)], now_ms=0, lateness_ms=0, idle_timeout_ms=100
    )
    later = advance_state(first, 1, [stats(0, T0 + 50_000)], now_ms=1_000, lateness_ms=0, idle_timeout_ms=100)
    assert later.watermark == T0 + 50_000


def test_positions_and_watermark_never_move_backwards_on_replay() -> None:
    first = advance_state(ServiceState(), 4, [stats(0, T0 + 9_000, 40)], now_ms=0, lateness_ms=0, idle_timeout_ms=100)
    replay = advance_state(first, 4, [stats(0, T0 + 1_000, 20)], now_ms=5, lateness_ms=0, idle_timeout_ms=100)
    assert replay.partitions["0"].event_time == T0 + 9_000
    assert replay.partitions["0"].offset == 40
    assert replay.watermark == first.watermark
    assert replay.last_batch == 4


def test_a_batch_of_only_late_or_bad_rows_does_not_refresh_activity() -> None:
    first = advance_state(ServiceState(), 0, [stats(0, T0)], now_ms=0, lateness_ms=0, idle_timeout_ms=100)
    second = advance_state(first, 1, [stats(0, None, 9)], now_ms=500, lateness_ms=0, idle_timeout_ms=100)
    assert second.partitions["0"].last_data_at == 0
    assert second.partitions["0"].offset == 9


def test_marker_pushes_the_old_watermark_past_the_cut() -> None:
    w = T0 + 60_000
    delay = 2_000
    assert marker_event_time(w, delay) - delay > w
