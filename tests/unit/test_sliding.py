"""Sliding windows (issue 22, section 3): the cut rule for every pair of window kinds, the rows that
go to both graphs around W, and which graph owns which windows (README, "Sliding windows")."""

import itertools
import math

import pytest

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, NodePosition, QueryKind, QuerySource, ServiceState, new_spark_query_id
from hotswap.contract.ownership import OwnedWindows, WindowOwner, owned_windows, window_owners
from hotswap.contract.windows import Windowing, cut_boundary, first_row_needed
from hotswap.service_graph.routing import decide_cut, graph_markers, plan_batch
from hotswap.service_sink.audit import Result, audit
from tests.conftest import DEMO_SOURCE

T0 = 1_700_000_000_000  # a multiple of 20 s (not of 30 s)
E = T0 + 50_000  # the largest window end routed before the cut

TUMBLING_10 = Windowing.of(10_000)
TUMBLING_20 = Windowing.of(20_000)
SLIDING_30_10 = Windowing.of(30_000, 10_000)
SLIDING_60_20 = Windowing.of(60_000, 20_000)


def test_a_query_window_is_tumbling_unless_its_slide_is_shorter_than_its_size() -> None:
    assert not Windowing.of(10_000).sliding  # no slide: tumbling
    assert not Windowing.of(10_000, 10_000).sliding
    assert SLIDING_30_10.sliding
    assert (SLIDING_30_10.grid_ms, SLIDING_30_10.reach_ms) == (10_000, 20_000)
    assert (TUMBLING_20.grid_ms, TUMBLING_20.reach_ms) == (20_000, 0)
    assert SLIDING_30_10.describe() == "30s every 10s"
    assert TUMBLING_20.describe() == "20s"


# (old, new, watermark, W): with a watermark behind E (a source under load), and one run ahead of it
# (a quiet source whose watermark moved on processing time).
CUTS = [
    pytest.param(TUMBLING_10, TUMBLING_20, E - 5_000, T0 + 60_000, id="tumbling-to-tumbling"),
    # The new version's first window after W starts 20 s before W: W >= E + 20 s.
    pytest.param(TUMBLING_10, SLIDING_30_10, E - 5_000, T0 + 70_000, id="tumbling-to-sliding"),
    pytest.param(SLIDING_30_10, TUMBLING_20, E - 5_000, T0 + 60_000, id="sliding-to-tumbling"),
    # W >= E + 40 s, on the 20 s grid both share.
    pytest.param(SLIDING_30_10, SLIDING_60_20, E - 5_000, T0 + 100_000, id="sliding-to-sliding"),
    # A tumbling old version's windows after E are empty, however far its watermark ran.
    pytest.param(TUMBLING_10, TUMBLING_20, E + 100_000, T0 + 60_000, id="quiet-tumbling-to-tumbling"),
    pytest.param(TUMBLING_10, SLIDING_30_10, E + 100_000, T0 + 70_000, id="quiet-tumbling-to-sliding"),
    # A sliding old version may have closed windows up to its watermark (E + 15 s): W is past them.
    pytest.param(SLIDING_30_10, TUMBLING_20, E + 15_000, T0 + 80_000, id="quiet-sliding-to-tumbling"),
    # Past E + size - slide its windows held no row when they closed: W need not go further.
    pytest.param(SLIDING_30_10, TUMBLING_20, E + 100_000, T0 + 80_000, id="quiet-sliding-far-to-tumbling"),
    pytest.param(SLIDING_30_10, SLIDING_60_20, E + 100_000, T0 + 100_000, id="quiet-sliding-to-sliding"),
]


@pytest.mark.parametrize(("old", "new", "watermark", "cut"), CUTS)
def test_the_cut_for_every_pair_of_window_kinds(old: Windowing, new: Windowing, watermark: int, cut: int) -> None:
    assert cut_boundary(E, old, new, watermark) == cut


def test_with_nothing_routed_the_cut_is_at_zero_whatever_the_kinds() -> None:
    for old, new in itertools.product((TUMBLING_10, SLIDING_30_10), repeat=2):
        assert cut_boundary(None, old, new) == 0


KINDS = [TUMBLING_10, TUMBLING_20, Windowing.of(30_000), SLIDING_30_10, SLIDING_60_20, Windowing.of(20_000, 5_000)]


def keeps_windows_whole(w: int, old: Windowing, new: Windowing, max_end: int, watermark: int) -> bool:
    """W is a boundary of both grids; the new version's first window after W starts at or after the
    largest routed window end (every row before it went to the old graph alone); and the old
    version's windows ending after W (from W + slide) that closed before the cut (up to the
    watermark) held no row, or there are none."""
    # The new version's first window ending after W starts at W + slide - size (the test's own arithmetic).
    if w % old.grid_ms or w % new.grid_ms or w + new.grid_ms - new.size_ms < max_end:
        return False
    return w >= watermark or w + old.grid_ms - old.size_ms >= max_end


@pytest.mark.parametrize(("old", "new"), list(itertools.product(KINDS, repeat=2)))
def test_the_cut_is_the_first_boundary_that_keeps_every_window_whole(old: Windowing, new: Windowing) -> None:
    step = math.lcm(old.grid_ms, new.grid_ms)
    for max_end, ahead in itertools.product(range(T0, T0 + 60_000, 7_000), (-3_000, 0, 9_000, 45_000)):
        watermark = max_end + ahead
        cut = cut_boundary(max_end, old, new, watermark)
        assert keeps_windows_whole(cut, old, new, max_end, watermark), (old, new, max_end, watermark, cut)
        assert not keeps_windows_whole(cut - step, old, new, max_end, watermark), (old, new, max_end, watermark)


# -- routing around W ---------------------------------------------------------------------------------
def graph(query_id: str, windows: Windowing) -> GraphRecord:
    source = QuerySource(name=query_id, kind=QueryKind.SQL, text="SELECT 1")
    return GraphRecord(
        query_id=query_id,
        source=source,
        window_ms=windows.size_ms,
        slide_ms=windows.slide_ms,
        topic=f"t.{query_id}",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )


def swap(old: Windowing, new: Windowing, state: SwapPhase, cut: int | None = None) -> SwapRecord:
    return SwapRecord(
        id="s1",
        from_query="old",
        to_query="new",
        state=state,
        cut_window_end=cut,
        old_window_ms=old.size_ms,
        old_slide_ms=old.slide_ms,
        new_window_ms=new.size_ms,
        new_slide_ms=new.slide_ms,
    )


def state(max_end: int, watermark: int) -> ServiceState:
    return ServiceState(
        last_batch=3,
        watermark=watermark,
        partitions={"0": NodePosition(window_end=max_end, event_time=max_end - 1), "1": NodePosition()},
    )


def test_the_service_graph_cuts_by_the_recorded_kinds() -> None:
    assert decide_cut(state(E, E - 5_000), swap(TUMBLING_10, SLIDING_30_10, SwapPhase.DEPLOYED)) == T0 + 70_000
    assert decide_cut(state(E, E - 5_000), swap(TUMBLING_10, TUMBLING_20, SwapPhase.DEPLOYED)) == T0 + 60_000


def receivers_of(event_time: int, old: Windowing, new: Windowing, cut: int) -> list[str]:
    graphs = {"old": graph("old", old), "new": graph("new", new)}
    plan = plan_batch(5, state(E, E - 5_000), graphs["old"], swap(old, new, SwapPhase.CUT, cut), graphs)
    return [d.query_id for d in plan.destinations if d.holds(event_time)]


def test_rows_in_the_overlap_before_w_go_to_both_graphs() -> None:
    w = T0 + 70_000  # tumbling 10 s to 30 s every 10 s: the new graph needs rows from W - 20 s
    assert receivers_of(w - 20_001, TUMBLING_10, SLIDING_30_10, w) == ["old"]
    assert receivers_of(w - 20_000, TUMBLING_10, SLIDING_30_10, w) == ["old", "new"]
    assert receivers_of(w - 1, TUMBLING_10, SLIDING_30_10, w) == ["old", "new"]
    assert receivers_of(w, TUMBLING_10, SLIDING_30_10, w) == ["new"]
    assert receivers_of(w + 25_000, TUMBLING_10, SLIDING_30_10, w) == ["new"]


def test_to_a_tumbling_version_no_row_goes_to_both() -> None:
    w = T0 + 60_000
    assert receivers_of(w - 1, SLIDING_30_10, TUMBLING_20, w) == ["old"]
    assert receivers_of(w, SLIDING_30_10, TUMBLING_20, w) == ["new"]


def test_the_old_graph_closes_nothing_past_w_and_the_new_one_follows_the_watermark() -> None:
    w = T0 + 70_000
    graphs = {"old": graph("old", TUMBLING_10), "new": graph("new", SLIDING_30_10)}
    plan = plan_batch(5, state(E, E - 5_000), graphs["old"], swap(TUMBLING_10, SLIDING_30_10, SwapPhase.CUT, w), graphs)
    assert {m.query_id: m.watermark for m in graph_markers(plan, w - 10_000)} == {"old": w - 10_001, "new": w - 10_001}
    assert {m.query_id: m.watermark for m in graph_markers(plan, w + 30_000)} == {"old": w, "new": w + 29_999}


def test_the_overlap_starts_no_earlier_than_any_row_routed_before_the_cut() -> None:
    for old, new in itertools.product(KINDS, repeat=2):
        w = cut_boundary(E, old, new, E - 5_000)
        assert first_row_needed(w, new) >= E


# -- ownership ----------------------------------------------------------------------------------------
def chain() -> list[SwapRecord]:
    """a -> b cut at W1 (completed), b -> c cut at W2 (draining)."""
    first = SwapRecord(id="s1", from_query="a", to_query="b", state=SwapPhase.COMPLETED, cut_window_end=T0 + 30_000)
    second = SwapRecord(id="s2", from_query="b", to_query="c", state=SwapPhase.DRAINING, cut_window_end=T0 + 70_000)
    return [first, second]


def test_each_version_owns_the_windows_ending_after_one_cut_and_through_the_next() -> None:
    assert window_owners(chain(), "c") == [
        WindowOwner(query_id="a", after=None, through=T0 + 30_000),
        WindowOwner(query_id="b", after=T0 + 30_000, through=T0 + 70_000, swap_id="s1"),
        WindowOwner(query_id="c", after=T0 + 70_000, through=None, swap_id="s2"),
    ]
    b = owned_windows(window_owners(chain(), "c"), graph("b", SLIDING_30_10))
    assert b == OwnedWindows(((T0 + 30_000, T0 + 70_000),))
    # The partial windows a sliding version closes at or before its cut are not its own.
    assert [b.holds(end) for end in (T0 + 30_000, T0 + 40_000, T0 + 70_000, T0 + 80_000)] == [False, True, True, False]


def test_every_window_end_has_exactly_one_owner() -> None:
    owners = window_owners(chain(), "c")
    for end in range(T0, T0 + 120_000, 5_000):
        assert sum(o.owns(end) for o in owners) == 1, end


def test_before_any_cut_the_serving_version_owns_everything_and_a_deployed_one_nothing() -> None:
    deployed = SwapRecord(id="s1", from_query="a", to_query="b", state=SwapPhase.DEPLOYED)
    owners = window_owners([deployed], "a")
    assert owners == [WindowOwner(query_id="a", after=None, through=None)]
    assert owned_windows(owners, graph("a", TUMBLING_10)).holds(T0)
    # The new graph receives no row before its cut, and emits nothing it could own.
    assert owned_windows(owners, graph("b", SLIDING_30_10)) == OwnedWindows(())
    assert not OwnedWindows(()).holds(T0)


def test_a_graph_taking_over_a_failed_graphs_buffer_owns_from_where_that_one_stopped() -> None:
    """Its range starts at `start_after` as soon as it starts, before its swap records the cut, so
    a batch it runs in between emits the same windows as after."""
    taking_over = graph("a-2", SLIDING_30_10).changed(start_after=T0 + 50_000)
    assert taking_over.reads_from == T0 + 30_000  # its first window after that point starts 20 s earlier
    before_cut = window_owners(chain()[:1], "b")
    assert owned_windows(before_cut, taking_over) == OwnedWindows(((T0 + 50_000, None),))
    failed = chain()[0]
    recovery = SwapRecord(
        id="s3", from_query="b", to_query="a-2", state=SwapPhase.CUT, cut_window_end=T0 + 50_000, recovers="s1"
    )
    assert owned_windows(window_owners([failed, recovery], "a-2"), taking_over) == OwnedWindows(((T0 + 50_000, None),))
    assert graph("a-3", TUMBLING_10).changed(start_after=T0 + 50_000).reads_from == T0 + 50_000


def test_the_results_audit_takes_a_sliding_versions_overlapping_windows_for_what_they_are() -> None:
    def result(query_id: str, start: int, size: int) -> Result:
        return Result(f"{start}|{size}", query_id, window_start=start, window_end=start + size, row={})

    # 10 s tumbling through W = 20 s, then 30 s every 10 s: windows ending 30, 40, 50 s.
    swapped = [result("v1", 0, 10), result("v1", 10, 10), *(result("v2", s, 30) for s in (0, 10, 20))]
    report = audit(swapped)
    assert report.ok, report
    assert report.windows_by_query == {"v1": 2, "v2": 3}
    # Two tumbling versions answering the same time are still caught, and so is a gap.
    assert audit([result("v1", 0, 10), result("v2", 0, 30)]).overlapping_windows == 1
    assert audit([result("v2", 0, 30), result("v2", 10, 30), result("v2", 50, 30)]).missing_windows == [(40, 50)]
