"""Validation off the loop: a submitted query is analysed on a worker thread (the executor's own),
while the loop's steps go on; the loop writes `validated` or `rejected` once the analysis is done,
in submission order, each swap checked against the one queued before it as it is then."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.executor.control.admission import on_own_thread
from tests.component.fakes import World
from tests.conftest import wait_until

pytestmark = pytest.mark.component

W1 = 60_000
DEADLINE_S = 10.0


@pytest.fixture
def world(settings: Settings) -> World:
    """A namespace serving query `a` (10 s windows), its submitted queries analysed on the
    executor's worker thread."""
    world = World(settings, worker=on_own_thread)
    world.serve("a", 10_000)
    return world


@pytest.fixture
def held(world: World) -> Iterator[threading.Event]:
    """The analysis of query `b` lasts until this is set (set at the end of the test, whatever happens)."""
    release = threading.Event()
    world.graphs.hold["b"] = release
    yield release
    release.set()


def analysing(world: World, name: str) -> None:
    wait_until(lambda: name in world.graphs.analysing, DEADLINE_S, f"the analysis of {name!r} to begin", 0.01)


def step_until_decided(world: World, swap_id: str) -> SwapRecord:
    """Executor steps, until the swap's analysis is done and its outcome written."""

    def decided() -> bool:
        world.protocol.step()
        return world.state(swap_id) is not SwapPhase.SUBMITTED

    wait_until(decided, DEADLINE_S, f"swap {swap_id} to be validated or rejected", 0.01)
    return world.journal.get(swap_id)


def test_the_loop_drives_the_running_swap_while_a_submitted_query_is_analysed(
    world: World, held: threading.Event
) -> None:
    x = world.submit("x", 30_000)
    assert step_until_decided(world, x).state is SwapPhase.DEPLOYING  # validated, and its turn came at once
    b = world.submit("b", 60_000)  # analysed against x, the swap queued before it

    world.protocol.step()
    analysing(world, "b")
    # Every step returns while b's analysis is still held, and drives x all the way through.
    assert world.state(x) is SwapPhase.DEPLOYED
    assert world.cut(x, W1) is not None
    world.watermark_passes_cut(x)
    world.emitted_through("a", W1)
    world.protocol.step()
    world.protocol.step()
    assert world.state(x) is SwapPhase.COMPLETED
    assert "b" in world.graphs.analysing
    assert world.state(b) is SwapPhase.SUBMITTED

    held.set()
    with capture_logs() as logs:
        validated = step_until_decided(world, b)
    assert validated.state in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING)
    said = [e for e in logs if e["event"] == "swap validated"]
    assert [(e["swap_id"], e["from_query"]) for e in said] == [(b, "x")]
    assert said[0]["validate_s"] >= 0  # how long the analysis took
    assert validated.new_window_ms == 60_000
    assert world.graphs.validated == ["x", "b"]  # x's completion did not change what b replaces: analysed once
    assert world.deploy(b).from_query == "x"


@pytest.mark.parametrize(
    ("fault", "reason", "code"),
    [
        ("refuse", "query 'b' does not analyse: column kye not found", ReasonCode.QUERY_INVALID),
        ("crash", "query 'b' could not be validated: ZeroDivisionError: division by zero", ReasonCode.QUERY_RAISED),
    ],
)
def test_a_rejection_arrives_with_its_reason_once_the_analysis_is_done(
    world: World, held: threading.Event, fault: str, reason: str, code: ReasonCode
) -> None:
    if fault == "refuse":
        world.graphs.refuse["b"] = reason
    else:
        world.graphs.crash["b"] = ZeroDivisionError("division by zero\n  File 'b.py', line 3")
    b = world.submit("b", 30_000)
    c = world.submit("c", 20_000)  # behind b: analysed only once b is decided
    world.protocol.step()
    analysing(world, "b")
    world.protocol.step()
    assert [world.state(s) for s in (b, c)] == [SwapPhase.SUBMITTED, SwapPhase.SUBMITTED]
    assert "c" not in world.graphs.analysing

    held.set()
    rejected = step_until_decided(world, b)
    assert (rejected.state, rejected.error, rejected.reason_code) == (SwapPhase.REJECTED, reason, code)
    assert world.graphs.get("b") is None
    step_until_decided(world, c)
    assert world.deploy(c).from_query == "a"


def test_a_swap_aborted_while_its_query_is_analysed_stays_aborted_and_the_next_one_is_validated_at_once(
    world: World, held: threading.Event
) -> None:
    b = world.submit("b", 30_000)
    world.protocol.step()
    analysing(world, "b")
    world.operator().abort(b)
    c = world.submit("c", 20_000)
    # b's analysis has not ended (it may never): it is abandoned, and c is analysed and decided now.
    assert step_until_decided(world, c).state in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING)
    assert "b" in world.graphs.analysing
    assert world.state(b) is SwapPhase.ABORTED
    assert world.deploy(c).from_query == "a"

    held.set()  # b's analysis ends late: its result is dropped, no graph is recorded for it
    world.protocol.step()
    assert world.state(b) is SwapPhase.ABORTED
    assert world.graphs.get("b") is None


def test_a_result_is_dropped_and_the_query_analysed_again_when_the_swap_before_it_ends_meanwhile(
    settings: Settings,
) -> None:
    world = World(settings, worker=on_own_thread)
    world.serve("a", 11_000)
    v = world.submit("v", 143_000)  # 11 s -> 143 s: a common boundary every 143 s
    step_until_decided(world, v)
    x = world.submit("x", 13_000)  # 143 s -> 13 s
    step_until_decided(world, x)
    release = threading.Event()
    world.graphs.hold["b"] = release
    try:
        b = world.submit("b", 11_000)  # 13 s -> 11 s cannot be cut; 143 s -> 11 s can
        world.protocol.step()
        analysing(world, "b")
        world.operator().abort(x)  # b now replaces v
        world.protocol.step()
        release.set()
        validated = step_until_decided(world, b)
    finally:
        release.set()
    assert validated.state is SwapPhase.VALIDATED, validated.error
    # Analysed again, against v. The abandoned first analysis ends on its own thread, maybe after the
    # second one decided the swap: waited for, not assumed.
    wait_until(lambda: world.graphs.validated.count("b") == 2, DEADLINE_S, "the abandoned analysis to end", 0.01)
    assert world.graphs.validated == ["v", "x", "b", "b"]


def test_a_stopping_executor_abandons_an_analysis_and_the_next_one_validates_the_swap_again(
    settings: Settings, world: World, held: threading.Event
) -> None:
    b = world.submit("b", 30_000)
    world.protocol.step()
    analysing(world, "b")
    world.protocol.close()  # does not wait for the analysis to end
    assert "b" in world.graphs.analysing
    assert world.state(b) is SwapPhase.SUBMITTED

    restarted = World(settings, client=world.client, worker=on_own_thread)
    restarted.graphs.hold["b"] = held
    restarted.protocol.step()
    analysing(restarted, "b")
    held.set()
    assert step_until_decided(restarted, b).state in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING)
    assert world.journal.get(b).new_window_ms == 30_000


def test_an_analysis_that_does_not_end_is_rejected_after_the_validation_timeout_and_the_queue_moves_on(
    world: World, held: threading.Event
) -> None:
    b = world.submit("b", 30_000)
    c = world.submit("c", 20_000)
    world.protocol.step()
    analysing(world, "b")
    world.clock.advance(world.settings.validation_timeout.s - 1)
    world.protocol.step()
    assert world.state(b) is SwapPhase.SUBMITTED
    world.clock.advance(2)
    world.protocol.step()
    record = world.journal.get(b)
    assert (record.state, record.reason_code) == (SwapPhase.REJECTED, ReasonCode.VALIDATION_TIMEOUT)
    assert "was not validated within 120s (validation_timeout)" in (record.error or "")
    assert step_until_decided(world, c).state is not SwapPhase.REJECTED


def test_a_query_that_calls_sys_exit_while_analysed_is_rejected_and_the_executor_carries_on(world: World) -> None:
    world.graphs.crash["b"] = SystemExit(0)  # what sys.exit(0) in a .py query raises
    b = world.submit("b", 30_000)
    record = step_until_decided(world, b)  # does not raise
    assert (record.state, record.reason_code) == (SwapPhase.REJECTED, ReasonCode.QUERY_RAISED)
    assert "SystemExit" in (record.error or "")
