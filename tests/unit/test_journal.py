import itertools

import fakeredis
import pytest

from contract.journal import (
    IllegalTransition,
    Journal,
    SwapPhase,
    SwapRecord,
    UnknownSwap,
    check_transition,
)
from contract.names import Keys


@pytest.fixture
def journal() -> Journal:
    return Journal(fakeredis.FakeRedis(), Keys("unit"))


def test_the_happy_path_is_legal_in_order() -> None:
    path = [
        SwapPhase.SUBMITTED,
        SwapPhase.VALIDATED,
        SwapPhase.DEPLOYED,
        SwapPhase.CUT,
        SwapPhase.DRAINING,
        SwapPhase.DRAINED,
        SwapPhase.RETIRED,
        SwapPhase.COMPLETED,
    ]
    for current, target in itertools.pairwise(path):
        check_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (SwapPhase.SUBMITTED, SwapPhase.CUT),  # never cut an unvalidated query
        (SwapPhase.CUT, SwapPhase.ABORTED),  # a recorded cut cannot be undone
        (SwapPhase.DRAINING, SwapPhase.DEPLOYED),  # no going back
        (SwapPhase.COMPLETED, SwapPhase.FAILED),  # terminal is terminal
        (SwapPhase.REJECTED, SwapPhase.VALIDATED),
    ],
)
def test_illegal_transitions_are_refused(current: SwapPhase, target: SwapPhase) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(current, target)


def test_terminal_phases_have_no_way_out_but_a_later_rollback_of_a_completed_swap() -> None:
    for phase in SwapPhase:
        if phase.is_terminal and phase not in (SwapPhase.COMPLETED, SwapPhase.FAILED):
            assert phase.next_phases == frozenset()
    assert SwapPhase.COMPLETED.next_phases == {SwapPhase.ROLLED_BACK}
    assert SwapPhase.FAILED.next_phases == {SwapPhase.ROLLED_BACK}


def test_each_transition_is_recorded_with_its_time(journal: Journal) -> None:
    journal.create(SwapRecord(id="a", to_query="q2"))
    journal.advance("a", SwapPhase.VALIDATED)
    record = journal.advance("a", SwapPhase.DEPLOYED)
    assert record is not None
    assert [p.name for p in record.phases] == [SwapPhase.SUBMITTED, SwapPhase.VALIDATED, SwapPhase.DEPLOYED]
    assert all(p.at > 0 for p in record.phases)
    assert journal.get("a") == record


def test_abort_and_cut_race_only_one_wins(journal: Journal) -> None:
    journal.create(SwapRecord(id="a", to_query="q2"))
    journal.advance("a", SwapPhase.VALIDATED)
    journal.advance("a", SwapPhase.DEPLOYED)
    cut = journal.advance("a", SwapPhase.CUT, when=lambda r: r.state is SwapPhase.DEPLOYED, cut_window_end=60_000)
    aborted = journal.advance("a", SwapPhase.ABORTED, when=lambda r: r.state is SwapPhase.DEPLOYED)
    assert cut is not None
    assert cut.cut_window_end == 60_000
    assert aborted is None
    assert journal.get("a").state is SwapPhase.CUT


def test_swaps_are_listed_in_submission_order(journal: Journal) -> None:
    for swap_id in ("c", "a", "b"):
        journal.create(SwapRecord(id=swap_id, to_query=swap_id))
    assert [s.id for s in journal.all()] == ["c", "a", "b"]


def test_unknown_swaps_are_named(journal: Journal) -> None:
    with pytest.raises(UnknownSwap, match="nope"):
        journal.get("nope")


def test_namespaces_do_not_collide() -> None:
    client = fakeredis.FakeRedis()
    Journal(client, Keys("a")).create(SwapRecord(id="x", to_query="q"))
    assert Journal(client, Keys("b")).find("x") is None
    assert Keys("a").swap("x") != Keys("b").swap("x")
    assert Keys("a").swap("x").startswith("hotswap:{a}:")
