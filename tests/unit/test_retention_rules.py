"""The pure rules behind retention and poison batches: which swaps may be forgotten, how a query id
is numbered, which rows a skipped batch holds."""

from __future__ import annotations

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import SkippedRows
from hotswap.executor.control.graphs import numbered
from hotswap.executor.control.retention import forgettable_swaps


def swap(
    swap_id: str, from_query: str, to_query: str, state: SwapPhase = SwapPhase.COMPLETED, **more: object
) -> SwapRecord:
    return SwapRecord(id=swap_id, from_query=from_query, to_query=to_query, state=state, **more)


def test_only_the_oldest_ended_swaps_beyond_the_kept_ones_are_forgotten() -> None:
    swaps = [swap("1", "a", "b"), swap("2", "b", "c"), swap("3", "c", "d"), swap("4", "d", "e")]
    assert [s.id for s in forgettable_swaps(swaps, live={"e"}, keep=2)] == ["1", "2"]
    assert forgettable_swaps(swaps, live={"e"}, keep=4) == []


def test_forgetting_stops_at_a_swap_that_must_stay() -> None:
    swaps = [
        swap("1", "a", "b"),
        swap("2", "b", "c"),  # c is owed windows (failed, not retired): live
        swap("3", "c", "d"),
        swap("4", "d", "e"),
        swap("5", "e", "f"),
    ]
    assert [s.id for s in forgettable_swaps(swaps, live={"c", "f"}, keep=1)] == ["1"]


def test_a_swap_named_by_a_rollback_that_stays_is_not_forgotten() -> None:
    swaps = [swap("1", "a", "b"), swap("2", "b", "c"), swap("3", "c", "b-2", rollback_of="2"), swap("4", "b-2", "d")]
    assert [s.id for s in forgettable_swaps(swaps, live={"d"}, keep=2)] == ["1"]


def test_a_rollback_and_the_swap_it_undid_are_forgotten_together() -> None:
    swaps = [
        swap("1", "a", "b"),
        swap("2", "b", "c", SwapPhase.ROLLED_BACK),
        swap("3", "c", "b-2", rollback_of="2"),
        swap("4", "b-2", "d"),
        swap("5", "d", "e"),
    ]
    assert [s.id for s in forgettable_swaps(swaps, live={"e"}, keep=1)] == ["1", "2", "3", "4"]


def test_an_open_swap_stops_forgetting() -> None:
    swaps = [swap("1", "a", "b", SwapPhase.STRANDED), swap("2", "b", "c"), swap("3", "c", "d")]
    assert forgettable_swaps(swaps, live=set(), keep=0) == []


def test_query_ids_are_numbered_by_name() -> None:
    assert numbered("count") == ("count", 1)
    assert numbered("count-3") == ("count", 3)
    assert numbered("count-1") == ("count-1", 1)  # ids are numbered from 2
    assert numbered("per-key") == ("per-key", 1)


def test_a_skipped_batch_holds_its_offsets_and_for_a_closing_graph_its_windows_rows_only() -> None:
    stateful = SkippedRows(partition=1, start=10, end=20, batch_id=3)
    assert stateful.holds(1, 10, 5_000)
    assert not stateful.holds(1, 20, 5_000)
    assert not stateful.holds(0, 15, 5_000)
    closing = SkippedRows(partition=1, start=10, end=20, batch_id=3, since_ms=10_000, until_ms=20_000)
    assert closing.holds(1, 15, 19_999)
    assert not closing.holds(1, 15, 20_000)  # a row of a window still open: kept
    assert not closing.holds(1, 15, 9_999)
