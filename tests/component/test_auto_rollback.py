"""Automatic rollback (`submit --auto-rollback`, setting `auto_rollback`): a swap whose new query
fails for good after its cut is rolled back by the executor itself, with the rollback queued in the
write that strands the swap; and its error budget (`rollback_failures` within `rollback_window`)."""

from __future__ import annotations

import pytest

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from tests.component.fakes import World, query

pytestmark = pytest.mark.component

W = 30_000
FAILURE = "[USER_RAISED_EXCEPTION] poison row"


def cut_with_auto_rollback(world: World, name: str = "b") -> str:
    """A swap to `name` submitted with --auto-rollback, deployed and cut at W, draining."""
    swap_id = f"s-{name}"
    world.journal.create(SwapRecord(id=swap_id, to_query=name, source=query(name, 30_000), auto_rollback=True))
    world.deploy(swap_id)
    assert world.cut(swap_id, W) is not None
    world.watermark_passes_cut(swap_id)
    return swap_id


def fail(world: World, query_id: str) -> list[tuple[str, str]]:
    """The query dies once; one executor tick (supervise, then the protocol sees what failed for good)."""
    world.graphs.fake_runner.die(query_id, FAILURE)
    failed = world.graphs.supervise()
    if failed:
        world.protocol.graphs_failed(failed)
    return [(record.query_id, reason) for record, reason in failed]


def fail_for_good(world: World, query_id: str) -> None:
    for attempt in range(world.settings.query_restarts + 1):
        fail(world, query_id)
        world.clock.advance(world.settings.query_restart_backoff.s * 2**attempt)
        world.graphs.supervise()


def budgeted() -> Settings:
    """Ten restarts, but a budget of one failure within 60 s."""
    return Settings(
        namespace="component", query_restarts=10, query_restart_backoff="2s", rollback_failures=1, rollback_window="60s"
    )


def rollback_of(world: World, swap_id: str) -> SwapRecord:
    return next(s for s in world.journal.all() if s.rollback_of == swap_id)


def test_a_new_query_that_fails_for_good_after_its_cut_is_rolled_back_on_its_own(world: World) -> None:
    forward = cut_with_auto_rollback(world)
    world.protocol.step()
    fail_for_good(world, "b")

    stranded = world.journal.get(forward)
    back = rollback_of(world, forward)
    assert stranded.state is SwapPhase.STRANDED
    assert stranded.reason_code is ReasonCode.QUERY_FAILED_AFTER_CUT
    assert stranded.error is not None
    assert stranded.error.endswith(f"rolled back automatically by swap {back.id}")
    # The swap back takes over b's buffer, with the reason it was queued, as `hotswap rollback` would.
    assert (back.to_query, back.recovers, back.source) == ("a", forward, query("a", 10_000))
    assert back.cause is not None
    assert back.cause.startswith(f"automatic rollback of swap {forward}: query b kept failing after 2 restarts")
    assert FAILURE in back.cause

    world.emitted_through("a", W)
    for _ in range(8):
        world.protocol.step()
    assert world.state(back.id) is SwapPhase.COMPLETED
    assert world.state(forward) is SwapPhase.ROLLED_BACK
    assert world.journal.get(back.id).cut_window_end == W  # b emitted nothing after W: a-2 answers it all
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "a-2"
    assert world.journal.open() == []


def test_a_swap_without_auto_rollback_stays_stranded_for_the_operator(world: World) -> None:
    forward = world.submit("b", 30_000)
    world.deploy(forward)
    world.cut(forward, W)
    world.watermark_passes_cut(forward)
    fail_for_good(world, "b")
    assert world.state(forward) is SwapPhase.STRANDED
    assert not any(s.rollback_of == forward for s in world.journal.all())


def test_the_namespace_default_rolls_back_every_swap(settings: Settings) -> None:
    world = World(settings.model_copy(update={"auto_rollback": True}))
    world.serve("a", 10_000)
    forward = world.submit("b", 30_000)
    world.deploy(forward)
    world.cut(forward, W)
    world.watermark_passes_cut(forward)
    fail_for_good(world, "b")
    assert rollback_of(world, forward).recovers == forward


def test_the_error_budget_rolls_back_before_the_restarts_are_spent() -> None:
    world = World(budgeted())
    world.serve("a", 10_000)
    forward = cut_with_auto_rollback(world)
    world.protocol.step()  # the active swap is past its cut: its new query is held to the budget

    assert fail(world, "b") == []  # the first failure: within the budget, restarted
    world.clock.advance(2)
    world.graphs.supervise()
    assert world.graphs.fake_runner.restarted == ["b"]
    reported = fail(world, "b")  # the second within 60 s: over the budget of 1
    assert len(reported) == 1
    assert "2 failures within 60s, over auto-rollback's error budget of 1" in reported[0][1]
    assert world.graph_state("b") is GraphState.FAILED
    stranded = world.journal.get(forward)
    assert stranded.state is SwapPhase.STRANDED
    assert stranded.error is not None
    assert stranded.error.startswith("query b failed more often than its error budget allows")
    assert rollback_of(world, forward).recovers == forward


def test_failures_spread_wider_than_the_window_stay_within_the_budget() -> None:
    world = World(budgeted())
    world.serve("a", 10_000)
    forward = cut_with_auto_rollback(world)
    world.protocol.step()
    for _ in range(3):
        assert fail(world, "b") == []
        world.clock.advance(61)  # the back-off passes, and the failure leaves the window
        world.graphs.supervise()
    assert world.state(forward) is SwapPhase.DRAINING


def test_a_rollback_is_never_rolled_back_itself(settings: Settings) -> None:
    world = World(settings.model_copy(update={"auto_rollback": True}))
    world.serve("a", 10_000)
    forward = world.submit("b", 30_000)
    world.deploy(forward)
    world.cut(forward, W)
    world.watermark_passes_cut(forward)
    world.emitted_through("a", W)
    for _ in range(6):
        world.protocol.step()
    assert world.state(forward) is SwapPhase.COMPLETED
    back = SwapRecord(id="back", to_query="a", source=query("a", 10_000), rollback_of=forward)
    world.journal.create(back)
    world.deploy("back")
    world.cut("back", 60_000)
    world.watermark_passes_cut("back")
    fail_for_good(world, "a-2")
    assert world.state("back") is SwapPhase.STRANDED
    assert not any(s.rollback_of == "back" for s in world.journal.all())


def test_a_query_that_fails_for_good_after_its_swap_completed_is_rolled_back_too(world: World) -> None:
    forward = cut_with_auto_rollback(world)
    world.emitted_through("a", W)
    for _ in range(6):
        world.protocol.step()
    assert world.state(forward) is SwapPhase.COMPLETED
    fail_for_good(world, "b")
    back = rollback_of(world, forward)
    assert back.recovers == forward  # takes over b's buffer from where b stopped
    assert back.cause is not None
    assert back.cause.startswith(f"automatic rollback of swap {forward}:")
    for _ in range(8):
        world.protocol.step()
    assert world.state(back.id) is SwapPhase.COMPLETED
    assert world.state(forward) is SwapPhase.ROLLED_BACK
