"""Every transition of SwapPhase, allowed and forbidden, through check_transition and through the
journal in Redis; and the phase classification against the rules in docs/architecture.md ("The swap
state machine").

The expected moves are written out here, by hand, from the protocol's rules: they are not read from
the product's table, so a wrong entry there fails these tests."""

from __future__ import annotations

import itertools
from collections import deque

import fakeredis
import pytest

from hotswap.contract.journal import IllegalTransition, Journal, SwapPhase, SwapRecord, check_transition
from hotswap.contract.names import Keys
from hotswap.contract.phases import WAIT_TEXT, WAITS, Driver, Wait, driven_by
from tests.component.fakes import World

pytestmark = pytest.mark.component

P = SwapPhase
# Every legal move, by hand: forward one phase at a time; before the cut, fail (not from submitted:
# rejected) or abort; past the cut until retiring, stranded; a completed or stranded swap ends undone.
EXPECTED_MOVES = {
    (P.SUBMITTED, P.VALIDATED),
    (P.SUBMITTED, P.REJECTED),
    (P.SUBMITTED, P.ABORTED),
    (P.VALIDATED, P.DEPLOYING),
    (P.VALIDATED, P.FAILED),
    (P.VALIDATED, P.ABORTED),
    (P.DEPLOYING, P.DEPLOYED),
    (P.DEPLOYING, P.FAILED),
    (P.DEPLOYING, P.ABORTED),
    (P.DEPLOYED, P.CUT),
    (P.DEPLOYED, P.FAILED),
    (P.DEPLOYED, P.ABORTED),
    # A shadow: started at S, then promoted (the cut), or its query dies, or it is dropped.
    (P.DEPLOYED, P.SHADOWING),
    (P.SHADOWING, P.CUT),
    (P.SHADOWING, P.FAILED),
    (P.SHADOWING, P.ABORTED),
    (P.CUT, P.DRAINING),
    (P.CUT, P.STRANDED),
    (P.DRAINING, P.DRAINED),
    (P.DRAINING, P.STRANDED),
    (P.DRAINED, P.RETIRING),
    (P.DRAINED, P.STRANDED),
    (P.RETIRING, P.RETIRED),
    (P.RETIRED, P.COMPLETED),
    (P.COMPLETED, P.ROLLED_BACK),
    (P.STRANDED, P.ROLLED_BACK),
    (P.STRANDED, P.FIXED_FORWARD),
}
PHASES = list(SwapPhase)
PAIRS = list(itertools.product(PHASES, PHASES))
ALLOWED = sorted(EXPECTED_MOVES)
FORBIDDEN = [pair for pair in PAIRS if pair not in EXPECTED_MOVES]
FORWARD = [
    P.SUBMITTED,
    P.VALIDATED,
    P.DEPLOYING,
    P.DEPLOYED,
    P.CUT,
    P.DRAINING,
    P.DRAINED,
    P.RETIRING,
    P.RETIRED,
    P.COMPLETED,
]
BEFORE_CUT = {P.SUBMITTED, P.VALIDATED, P.DEPLOYING, P.DEPLOYED, P.SHADOWING}
PAST_CUT = {P.CUT, P.DRAINING, P.DRAINED, P.RETIRING, P.RETIRED, P.STRANDED}
TERMINAL = {P.COMPLETED, P.FAILED, P.REJECTED, P.ABORTED, P.ROLLED_BACK, P.FIXED_FORWARD}
# The old graph still owns the rows before W: routing keeps a cut route to it.
DRAINS = {P.CUT, P.DRAINING, P.DRAINED, P.STRANDED}
KEYS = Keys("component")


def pair_id(pair: tuple[SwapPhase, SwapPhase]) -> str:
    return f"{pair[0]}->{pair[1]}"


def moves_from(phase: SwapPhase) -> set[SwapPhase]:
    return {b for a, b in EXPECTED_MOVES if a is phase}


def path_to(target: SwapPhase) -> list[SwapPhase]:
    """The shortest chain of expected moves from `submitted` to `target` (empty for submitted)."""
    came_from: dict[SwapPhase, SwapPhase | None] = {SwapPhase.SUBMITTED: None}
    todo = deque([SwapPhase.SUBMITTED])
    while todo:
        phase = todo.popleft()
        for nxt in sorted(moves_from(phase)):
            if nxt not in came_from:
                came_from[nxt] = phase
                todo.append(nxt)
    assert target in came_from, f"{target} cannot be reached from submitted"
    path: list[SwapPhase] = []
    step: SwapPhase | None = target
    while step is not None and step is not SwapPhase.SUBMITTED:
        path.append(step)
        step = came_from[step]
    return path[::-1]


def reachable_from(phase: SwapPhase) -> set[SwapPhase]:
    """`phase` and every phase a swap in it can still reach, by the product's own table."""
    seen, todo = {phase}, [phase]
    while todo:
        for nxt in todo.pop().next_phases - seen:
            seen.add(nxt)
            todo.append(nxt)
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


def test_the_table_allows_exactly_the_expected_moves() -> None:
    table = {(a, b) for a in SwapPhase for b in a.next_phases}
    assert table - EXPECTED_MOVES == set(), "moves the table allows that the protocol does not"
    assert EXPECTED_MOVES - table == set(), "moves the protocol needs that the table refuses"


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
    # The index of open swaps follows: a swap that ended leaves it in the same write.
    assert [s.id for s in journal.open()] == ([] if target in TERMINAL else ["s"])


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


def test_each_phase_is_classified_as_the_protocol_says() -> None:
    for phase in SwapPhase:
        assert phase.is_before_cut == (phase in BEFORE_CUT), phase
        assert phase.is_past_cut == (phase in PAST_CUT), phase
        assert phase.is_terminal == (phase in TERMINAL), phase
        assert phase.is_draining == (phase in DRAINS), phase
        assert phase.is_stranded == (phase is P.STRANDED), phase
        assert phase.is_in_flight == (phase not in TERMINAL | {P.SUBMITTED, P.STRANDED}), phase
        assert phase.is_done == (phase in {P.COMPLETED, P.ROLLED_BACK, P.FIXED_FORWARD}), phase


def test_a_swap_can_be_aborted_until_its_cut_and_never_after() -> None:
    for phase in SwapPhase:
        assert phase.can_become(SwapPhase.ABORTED) == (phase in BEFORE_CUT), phase


def test_a_recorded_cut_is_never_re_decided() -> None:
    into_cut = {phase for phase in SwapPhase if phase.can_become(SwapPhase.CUT)}
    assert into_cut == {SwapPhase.DEPLOYED, SwapPhase.SHADOWING}  # a fresh graph's cut, or a shadow's promotion
    for phase in PAST_CUT:
        assert not any(nxt in BEFORE_CUT for nxt in phase.next_phases), phase


def test_failed_means_before_the_cut_and_stranded_after_it() -> None:
    into_failed = {phase for phase in SwapPhase if phase.can_become(SwapPhase.FAILED)}
    into_stranded = {phase for phase in SwapPhase if phase.can_become(SwapPhase.STRANDED)}
    assert into_failed == BEFORE_CUT - {P.SUBMITTED}
    assert into_stranded == {P.CUT, P.DRAINING, P.DRAINED}
    assert SwapPhase.FAILED.next_phases == frozenset()  # the old query serves: nothing left to do
    assert SwapPhase.STRANDED.next_phases == {P.ROLLED_BACK, P.FIXED_FORWARD}  # only a recovery ends it


def test_ended_swaps_only_become_rolled_back_and_only_completed_or_stranded_ones_do() -> None:
    for phase in TERMINAL:
        assert phase.next_phases <= {SwapPhase.ROLLED_BACK}, phase
    undoable = {phase for phase in SwapPhase if phase.can_become(SwapPhase.ROLLED_BACK)}
    assert undoable == {SwapPhase.COMPLETED, SwapPhase.STRANDED}
    assert SwapPhase.ROLLED_BACK.next_phases == frozenset()


def test_only_ended_swaps_have_nowhere_to_go() -> None:
    for phase in SwapPhase:
        if not phase.next_phases:
            assert phase.is_terminal, phase


def test_a_refused_condition_writes_nothing_and_returns_none() -> None:
    client, journal = journal_with_swap_in(SwapPhase.DEPLOYED)
    stored = client.get(KEYS.swap("s"))
    assert journal.advance("s", SwapPhase.CUT, when=lambda r: r.state is SwapPhase.VALIDATED) is None
    assert client.get(KEYS.swap("s")) == stored


def test_every_phase_the_executor_drives_has_a_handler(world: World) -> None:
    # An ordinary swap, a recovery, a shadow, a promoted shadow.
    kinds = ((False, False, False), (True, False, False), (False, True, False), (False, True, True))
    in_flight = {
        phase.waits_for(recovery=r, shadow=sh, promoted=pr)
        for phase in SwapPhase
        for r, sh, pr in kinds
        if phase.is_in_flight
    }
    driven = {wait for wait in in_flight if wait is not None and wait.driver is Driver.EXECUTOR}
    assert set(world.protocol.handlers) == driven
    # The executor watches the waits another driver moves on; the service graph's batch has a move for
    # each of its own, but the drain, which it records once a batch's rows are routed.
    assert set(world.protocol.watches) == in_flight - driven
    by_batch = {wait for wait in in_flight if wait is not None and wait.driver is Driver.SERVICE_BATCH}
    assert set(world.service.moves) == by_batch - {Wait.WATERMARK}
    # And every wait of the table, driven or not, has its status text.
    waits = {p.waits_for(recovery=r, shadow=sh, promoted=pr) for p in SwapPhase for r, sh, pr in kinds} - {None}
    assert waits <= set(WAIT_TEXT)
    assert set(WAITS) == set(Wait)


# Who moves a swap on from each phase, by hand from the protocol: the service graph's batch takes the
# cut, starts a shadow at S, cuts to a promoted shadow and records that the watermark passed W; an
# operator promotes a shadow and takes a stranded swap over; the executor does the rest, a recovery's
# cut and drain included. Any phase of an unfinished swap not listed here is the executor's.
KINDS = {
    "swap": SwapRecord(id="s", to_query="b"),
    "recovery": SwapRecord(id="s", to_query="b", recovers="r"),
    "shadow": SwapRecord(id="s", to_query="b", shadow=True),
    "promoted shadow": SwapRecord(id="s", to_query="b", shadow=True, promote=True),
}
EXPECTED_DRIVERS = {
    (P.DEPLOYED, "swap"): Driver.SERVICE_BATCH,
    (P.DEPLOYED, "shadow"): Driver.SERVICE_BATCH,
    (P.DEPLOYED, "promoted shadow"): Driver.SERVICE_BATCH,
    (P.SHADOWING, "shadow"): Driver.OPERATOR,
    (P.SHADOWING, "promoted shadow"): Driver.SERVICE_BATCH,
    (P.CUT, "swap"): Driver.SERVICE_BATCH,
    (P.CUT, "shadow"): Driver.SERVICE_BATCH,
    (P.CUT, "promoted shadow"): Driver.SERVICE_BATCH,
    (P.STRANDED, "swap"): Driver.OPERATOR,
    (P.STRANDED, "recovery"): Driver.OPERATOR,
    (P.STRANDED, "shadow"): Driver.OPERATOR,
    (P.STRANDED, "promoted shadow"): Driver.OPERATOR,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_phase_names_who_moves_a_swap_on(kind: str) -> None:
    for phase in SwapPhase:
        swap = KINDS[kind].changed(state=phase)
        if phase is P.SHADOWING and not swap.shadow:
            continue  # only a shadow shadows
        drivers = {driver for driver in Driver if driven_by(swap, driver) is not None}
        if phase.is_terminal:
            assert drivers == set(), phase
            continue
        assert drivers == {EXPECTED_DRIVERS.get((phase, kind), Driver.EXECUTOR)}, phase
        assert swap.wait is not None
        assert driven_by(swap, swap.wait.driver) is swap.wait
