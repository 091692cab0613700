import pytest

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, NodePosition, QueryKind, QuerySource, ServiceState, new_spark_query_id
from hotswap.service_graph.errors import NoTargetGraph
from hotswap.service_graph.routing import (
    IdleClock,
    Idleness,
    PartitionBatchStats,
    advance_state,
    decide_cut,
    graph_markers,
    plan_batch,
    time_jump_limit,
)
from tests.conftest import DEMO_SOURCE

T0 = 1_700_000_000_000


def graph(query_id: str, window_ms: int = 10_000) -> GraphRecord:
    source = QuerySource(name=query_id, kind=QueryKind.SQL, text="SELECT 1")
    return GraphRecord(
        query_id=query_id,
        source=source,
        window_ms=window_ms,
        slide_ms=window_ms,
        topic=f"t.{query_id}",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )


def swap(state: SwapPhase, cut: int | None = None) -> SwapRecord:
    return SwapRecord(
        id="s1",
        from_query="old",
        to_query="new",
        state=state,
        cut_window_end=cut,
        old_window_ms=10_000,
        old_slide_ms=10_000,
        new_window_ms=30_000,
        new_slide_ms=30_000,
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
    # From 10 s to 30 s windows: the 30 s boundaries near T0 are T0 + 10 s, T0 + 40 s, T0 + 70 s.
    state = state_with(T0 + 10_000, T0 + 50_000, T0 + 20_000)
    assert decide_cut(state, swap(SwapPhase.DEPLOYED)) == T0 + 70_000
    # A largest window end that already is a common boundary is the cut itself.
    state = state_with(T0 + 10_000, T0 + 40_000)
    assert decide_cut(state, swap(SwapPhase.DEPLOYED)) == T0 + 40_000


def test_after_the_cut_rows_before_w_go_old_and_later_rows_go_new() -> None:
    cut = T0 + 60_000
    plan = plan_batch(5, state_with(T0), GRAPHS["old"], swap(SwapPhase.CUT, cut), GRAPHS)
    assert plan.target_topic == "t.new"
    assert plan.cut is not None
    assert (plan.cut.boundary, plan.cut.old_topic) == (cut, "t.old")
    old, new = plan.destinations
    assert (old.topic, old.since, old.until) == ("t.old", None, cut)
    assert (new.topic, new.since, new.until) == ("t.new", cut, None)
    assert [d.query_id for d in plan.destinations if d.holds(cut - 1)] == ["old"]
    assert [d.query_id for d in plan.destinations if d.holds(cut)] == ["new"]


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


def test_a_stranded_swap_keeps_its_cut_and_a_retiring_one_routes_everything_to_the_new_graph() -> None:
    cut = T0 + 60_000
    stranded = plan_batch(5, state_with(T0), GRAPHS["old"], swap(SwapPhase.STRANDED, cut), GRAPHS)
    assert stranded.target_query == "new"
    assert stranded.cut is not None
    assert stranded.cut.boundary == cut
    for phase in (SwapPhase.RETIRING, SwapPhase.RETIRED):
        plan = plan_batch(5, state_with(T0), GRAPHS["old"], swap(phase, cut), GRAPHS)
        assert (plan.target_query, plan.cut) == ("new", None)


def stats(partition: int, ts: int | None, offset: int = 5) -> PartitionBatchStats:
    end = None if ts is None else (ts // 10_000) * 10_000 + 10_000
    return PartitionBatchStats(partition, offset, ts, end, late=0, dead_letter=0)


ACTIVE = Idleness()


def test_watermark_is_the_slowest_active_partition_minus_lateness() -> None:
    state = advance_state(
        ServiceState(), 0, [stats(0, T0 + 9_000), stats(1, T0 + 4_000)], now_ms=1, lateness_ms=2_000, idleness=ACTIVE
    )
    assert state.watermark == T0 + 2_000
    assert state.partitions["0"].window_end == T0 + 10_000


def test_an_idle_partition_stops_holding_the_watermark_back() -> None:
    first = advance_state(
        ServiceState(), 0, [stats(0, T0 + 1_000), stats(1, T0 + 1_000)], now_ms=0, lateness_ms=0, idleness=ACTIVE
    )
    later = advance_state(
        first, 1, [stats(0, T0 + 50_000)], now_ms=1_000, lateness_ms=0, idleness=Idleness(idle=frozenset({"1"}))
    )
    assert later.watermark == T0 + 50_000
    assert later.partitions["1"].idle
    assert later.idle_partitions == ["1"]


def test_when_every_partition_is_idle_the_watermark_follows_processing_time() -> None:
    first = advance_state(
        ServiceState(), 0, [stats(0, T0 + 9_000), stats(1, T0 + 4_000)], now_ms=0, lateness_ms=2_000, idleness=ACTIVE
    )
    quiet = Idleness(idle=frozenset({"0", "1"}), quiet_ms=30_000)
    later = advance_state(first, 0, [], now_ms=30_000, lateness_ms=2_000, idleness=quiet)
    # From the furthest partition, minus the lateness, plus the 30 s of quiet.
    assert later.watermark == T0 + 9_000 - 2_000 + 30_000
    # All idle but no quiet time measured (idle_timeout off): it stays where it was.
    held = advance_state(first, 0, [], now_ms=30_000, lateness_ms=2_000, idleness=Idleness(idle=frozenset({"0", "1"})))
    assert held.watermark == first.watermark


def test_the_idle_clock_starts_afresh_and_can_be_off() -> None:
    clock = IdleClock(idle_timeout_ms=10_000, started_at=100.0)
    assert clock.quiet(["0", "1"], now=105.0) == frozenset()
    clock.rows_seen(["0"], now=108.0)
    assert clock.quiet(["0", "1"], now=111.0) == frozenset({"1"})
    assert clock.idleness(["0", "1"], frozenset({"1"}), now=111.0).quiet_ms is None
    everyone = clock.idleness(["0", "1"], frozenset({"0", "1"}), now=120.0)
    assert everyone.quiet_ms == 12_000  # since the last row, at 108 s
    assert IdleClock(idle_timeout_ms=None, started_at=0.0).quiet(["0"], now=1e9) == frozenset()


def test_positions_and_watermark_never_move_backwards_on_replay() -> None:
    first = advance_state(ServiceState(), 4, [stats(0, T0 + 9_000, 40)], now_ms=0, lateness_ms=0, idleness=ACTIVE)
    replay = advance_state(first, 4, [stats(0, T0 + 1_000, 20)], now_ms=5, lateness_ms=0, idleness=ACTIVE)
    assert replay.partitions["0"].event_time == T0 + 9_000
    assert replay.partitions["0"].offset == 40
    assert replay.watermark == first.watermark
    assert replay.last_batch == 4


def test_a_batch_of_only_late_or_bad_rows_does_not_refresh_activity() -> None:
    first = advance_state(ServiceState(), 0, [stats(0, T0)], now_ms=0, lateness_ms=0, idleness=ACTIVE)
    second = advance_state(first, 1, [stats(0, None, 9)], now_ms=500, lateness_ms=0, idleness=ACTIVE)
    assert second.partitions["0"].last_data_at == 0
    assert second.partitions["0"].offset == 9


def test_events_far_ahead_of_the_watermark_are_refused_even_in_the_first_batch() -> None:
    hour = 3_600_000
    assert time_jump_limit(T0, None, hour) == T0 + hour
    # No watermark yet: the batch's median event time stands in for it.
    assert time_jump_limit(None, T0 + 5, hour) == T0 + 5 + hour
    assert time_jump_limit(None, None, hour) is None


def test_markers_hold_each_graph_one_ms_below_the_service_watermark_until_the_cut_drains() -> None:
    cut = T0 + 60_000
    plan = plan_batch(5, state_with(T0), GRAPHS["old"], swap(SwapPhase.CUT, cut), GRAPHS)
    before = {m.query_id: m.watermark for m in graph_markers(plan, cut - 5_000)}
    assert before == {"new": cut - 5_001, "old": cut - 5_001}
    # Once the watermark reaches W nothing more goes to the old graph: W itself closes its last windows.
    at_cut = {m.query_id: m.watermark for m in graph_markers(plan, cut)}
    assert at_cut == {"new": cut - 1, "old": cut}
    # Past W the old graph's watermark stays at W: a window ending after W is not its own to close.
    past = {m.query_id: m.watermark for m in graph_markers(plan, cut + 30_000)}
    assert past == {"new": cut + 29_999, "old": cut}
    assert graph_markers(plan, None) == []
