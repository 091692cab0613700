"""Every transition of SwapPhase, allowed and forbidden, through check_transition and through the
journal in Redis; and the phase classification against the rules in docs/architecture.md ("The swap state machine")."""

from __future__ import annotations

import itertools
from collections import deque

import fakeredis
import pytest

from hotswap.contract.journal import IllegalTransition, Journal, SwapPhase, SwapRecord, check_transition
from hotswap.contract.names import Keys

pytestmark = pytest.mark.component

PHASES = list(SwapPhase)
PAIRS = list(itertools.product(PHASES, PHASES))
ALLOWED = [(a, b) for a, b in PAIRS if b in a.next_phases]
FORBIDDEN = [(a, b) for a, b in PAIRS if b not in a.next_phases]
FORWARD = [
    SwapPhase.SUBMITTED,
    SwapPhase.VALIDATED,
    SwapPhase.DEPLOYED,
    SwapPhase.CUT,
    SwapPhase.DRAINING,
    SwapPhase.DRAINED,
    SwapPhase.RETIRED,
    SwapPhase.COMPLETED,
]
KEYS = Keys("component")


def pair_id(pair: tuple[SwapPhase, SwapPhase]) -> str:
    return f"{pair[0]}->{pair[1]}"


def path_to(target: SwapPhase) -> list[SwapPhase]:
    """The shortest chain of legal moves from `submitted` to `target` (empty for submitted)."""
    came_from: dict[SwapPhase, SwapPhase | None] = {SwapPhase.SUBMITTED: None}
    todo = deque([SwapPhase.SUBMITTED])
    while todo:
        phase = todo.popleft()
        for following in sorted(phase.next_phases):
            if following not in came_from:
                came_from[following] = phase
                todo.append(following)
    assert target in came_from, f"{target} cannot be reached from submitted"
    path: list[SwapPhase] = []
    step: SwapPhase | None = target
    while step is not None and step is not SwapPhase.SUBMITTED:
        path.append(step)
        step = came_from[step]
    return path[::-1]


def reachable_from(phase: SwapPhase) -> set[SwapPhase]:
    """`phase` and every phase a swap in it can still reach."""
    seen, todo = {phase}, [phase]
    while todo:
        for following in todo.pop().next_phases - seen:
            seen.add(following)
            todo.append(following)
    return seen


def journal_with_swap_in(phase: SwapPhase) -> tuple[fakeredis.FakeRedis, Journal]:
    """A swap brought to `phase` by legal moves only, as every stored swap was."""
    client = fakeredis.FakeRedis()
    journal = Journal(client, KEYS)
    journal.create(SwapRecord(id="s", to_query="b"))
    for step in path_to(phase):
        journal.advance("s", step, cut_window_end=60_000 if step is SwapPhase.CUT else None)
    assert journal.get("s").state is phase
    return client, journal


@pytest.mark.parametrize(("current", "target"), ALLOWED, ids=[pair_id(p) for p in ALLOWED])
def test_an_allowed_move_is_accepted_and_recorded_with_its_time(current: SwapPhase, target: SwapPhase) -> None:
    check_transition(current, target)
    assert current.can_become(target)
    _, journal = journal_with_swap_in(current)
    before = journal.get("s")
    moved = journal.advance("s", target)
    assert moved is not None
    assert moved.state is target
    assert [p.name for p in moved.phases] == [*[p.name for p in before.phases], target]
    assert moved.phases[-1].at >= before.phases[-1].at
    assert journal.get("s") == moved


@pytest.mark.parametrize(("current", "target"), FORBIDDEN, ids=[pair_id(p) for p in FORBIDDEN])
def test_a_forbidden_move_is_refused_and_changes_nothing(current: SwapPhase, target: SwapPhase) -> None:
    assert not current.can_become(target)
    with pytest.raises(IllegalTransition, match=f"from {current} to {target}"):
        check_transition(current, target)
    client, journal = journal_with_swap_in(current)
    stored = client.get(KEYS.swap("s"))
    with pytest.raises(IllegalTransition):
        journal.advance("s", target, error="must not be written", cut_window_end=1)
    # Even a caller whose condition accepts the record cannot force the move.
    with pytest.raises(IllegalTransition):
        journal.advance("s", target, when=lambda r: True)
    assert client.get(KEYS.swap("s")) == stored


def test_every_phase_can_be_reached_from_submitted() -> None:
    assert reachable_from(SwapPhase.SUBMITTED) == set(SwapPhase)


def test_every_unfinished_swap_can_still_reach_an_end() -> None:
    """Nothing stuck (README, "Guarantees"): from every phase a terminal phase is reachable."""
    for phase in SwapPhase:
        assert any(p.is_terminal for p in reachable_from(phase)), phase


def test_the_happy_path_goes_forward_only() -> None:
    for current, target in itertools.pairwise(FORWARD):
        assert current.can_become(target)
    for i, later in enumerate(FORWARD):
        for earlier in FORWARD[: i + 1]:
            assert not later.can_become(earlier), f"{later} must not go back to {earlier}"


def test_a_swap_can_be_aborted_until_its_cut_and_never_after() -> None:
    for phase in SwapPhase:
        if phase.is_before_cut:
            assert phase.can_become(SwapPhase.ABORTED), phase
        else:
            assert not phase.can_become(SwapPhase.ABORTED), phase


def test_a_recorded_cut_is_never_re_decided() -> None:
    into_cut = {phase for phase in SwapPhase if phase.can_become(SwapPhase.CUT)}
    assert into_cut == {SwapPhase.DEPLOYED}
    for phase in SwapPhase:
        if phase.is_past_cut:
            assert not any(following.is_before_cut for following in phase.next_phases), phase


def test_ended_swaps_only_become_rolled_back_and_only_completed_or_failed_ones_do() -> None:
    for phase in SwapPhase:
        if phase.is_terminal:
            assert phase.next_phases <= {SwapPhase.ROLLED_BACK}, phase
    undoable = {phase for phase in SwapPhase if phase.can_become(SwapPhase.ROLLED_BACK)}
    assert undoable == {SwapPhase.COMPLETED, SwapPhase.FAILED}
    assert SwapPhase.ROLLED_BACK.next_phases == frozenset()


def test_only_ended_swaps_have_nowhere_to_go() -> None:
    for phase in SwapPhase:
        if not phase.next_phases:
            assert phase.is_terminal, phase


def test_every_phase_is_exactly_one_of_before_the_cut_past_it_or_ended() -> None:
    for phase in SwapPhase:
        assert [phase.is_before_cut, phase.is_past_cut, phase.is_terminal].count(True) == 1, phase


def test_a_draining_swap_is_past_its_cut_and_the_old_graph_still_owns_windows_up_to_w() -> None:
    for phase in SwapPhase:
        if phase.is_draining:
            assert phase.is_past_cut, phase
    # Retired: the old graph is gone, so nothing drains any more, but the cut still holds.
    assert SwapPhase.RETIRED.is_past_cut
    assert not SwapPhase.RETIRED.is_draining


def test_a_swap_is_in_flight_from_validation_until_it_ends() -> None:
    assert not SwapPhase.SUBMITTED.is_in_flight
    for phase in reachable_from(SwapPhase.VALIDATED):
        assert phase.is_in_flight == (not phase.is_terminal), phase
    for phase in SwapPhase:
        if phase.is_terminal:
            assert not phase.is_in_flight, phase
    # Only validation puts a submitted swap in flight; its other moves end it.
    assert {p for p in SwapPhase.SUBMITTED.next_phases if p.is_in_flight} == {SwapPhase.VALIDATED}


def test_only_a_swap_that_completed_counts_as_done_even_once_rolled_back() -> None:
    done = {phase for phase in SwapPhase if phase.is_done}
    assert done == {SwapPhase.COMPLETED, SwapPhase.ROLLED_BACK}
    assert all(phase.is_terminal for phase in done)
    # A failed swap that was rolled back also ends rolled_back; is_done is about the phase alone.
    assert SwapPhase.FAILED.can_become(SwapPhase.ROLLED_BACK)
    assert not SwapPhase.FAILED.is_done


def test_a_refused_condition_writes_nothing_and_returns_none() -> None:
    client, journal = journal_with_swap_in(SwapPhase.DEPLOYED)
    stored = client.get(KEYS.swap("s"))
    assert journal.advance("s", SwapPhase.CUT, when=lambda r: r.state is SwapPhase.VALIDATED) is None
    assert client.get(KEYS.swap("s")) == stored
