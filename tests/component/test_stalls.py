"""A batch that runs longer than `batch_stall_timeout` is cancelled, counted and its query restarted
from its checkpoint; an old graph whose batches keep stalling in a drain leaves the swap waiting for
an operator with `drain_stalled`, and the drain ends once the old graph is resumed and emits."""

from __future__ import annotations

import pytest

from hotswap.contract.journal import SwapPhase
from hotswap.contract.lifecycle import BatchWatch
from hotswap.contract.names import STALLED
from hotswap.contract.reasons import ReasonCode
from tests.component.fakes import World

pytestmark = pytest.mark.component

W = 30_000
STALL = "a batch ran 301s, longer than batch_stall_timeout (300s); it was cancelled"


def stall(world: World, query_id: str) -> list[str]:
    """The query's batch stalls; one executor tick sees it. Returns the queries failed for good."""
    world.graphs.fake_runner.stalling[query_id] = STALL
    failed = world.graphs.supervise()
    if failed:
        world.protocol.graphs_failed(failed)
    return [record.query_id for record, _ in failed]


def looks_often(world: World) -> bool:
    """Whether the executor's loop looks at the old graph's progress at its drain pace."""
    return world.protocol.awaiting_output


def counted(world: World, query_id: str) -> int:
    return int(world.client.hget(world.keys.counters, f"{STALLED}{query_id}") or 0)


def test_a_stalled_batch_is_counted_and_its_graph_restarted_from_its_checkpoint(world: World) -> None:
    world.graphs.fake_runner.restarted.clear()
    assert stall(world, "a") == []
    assert counted(world, "a") == 1
    world.clock.advance(world.settings.query_restart_backoff.s)
    world.graphs.supervise()
    assert world.graphs.fake_runner.restarted == ["a"]
    assert world.graphs.fake_runner.failure("a") is None


def test_an_old_graph_that_keeps_stalling_in_a_drain_leaves_the_swap_drain_stalled(world: World) -> None:
    swap_id = world.submit("b", 30_000)
    world.deploy(swap_id)
    world.cut(swap_id, W)
    world.watermark_passes_cut(swap_id)
    world.protocol.step()
    assert world.state(swap_id) is SwapPhase.DRAINING
    assert looks_often(world)

    failed: list[str] = []
    for attempt in range(world.settings.query_restarts + 1):
        failed = stall(world, "a")
        world.clock.advance(world.settings.query_restart_backoff.s * 2**attempt)
        world.graphs.supervise()
    assert failed == ["a"]
    assert counted(world, "a") == world.settings.query_restarts + 1

    swap = world.journal.get(swap_id)
    assert swap.state is SwapPhase.DRAINING  # past its cut nothing is undone: b keeps its windows
    assert swap.reason_code is ReasonCode.DRAIN_STALLED
    assert swap.error is not None
    assert "the drain stalled" in swap.error
    assert "restart `hotswap run`" in swap.error
    world.protocol.step()
    assert not looks_often(world), "a stalled drain waits for an operator, at the loop's usual pace"

    # The operator fixed the cause and restarted: the old graph emits through W, and the drain ends.
    world.emitted_through("a", W)
    for _ in range(4):
        world.protocol.step()
    done = world.journal.get(swap_id)
    assert done.state is SwapPhase.COMPLETED
    assert done.reason_code is None
    assert done.error is None


def test_the_watch_reports_a_batch_once_when_it_passes_the_limit() -> None:
    watch = BatchWatch(limit_s=10.0)
    assert watch.seen(active=True, last_batch=4, now=100.0) is None
    assert watch.seen(active=True, last_batch=4, now=110.0) is None
    assert watch.seen(active=True, last_batch=4, now=110.5) == pytest.approx(10.5)
    assert watch.seen(active=True, last_batch=4, now=130.0) is None  # the same batch: said once


def test_the_watch_starts_again_with_each_batch_and_between_batches() -> None:
    watch = BatchWatch(limit_s=10.0)
    watch.seen(active=True, last_batch=4, now=100.0)
    assert watch.seen(active=True, last_batch=5, now=109.0) is None  # batch 5 finished: the next began
    assert watch.seen(active=True, last_batch=5, now=118.0) is None
    assert watch.seen(active=False, last_batch=None, now=118.5) is None  # between batches
    assert watch.seen(active=True, last_batch=6, now=119.0) is None
    assert watch.seen(active=True, last_batch=6, now=129.5) == pytest.approx(10.5)


def test_the_watch_is_off_without_a_limit() -> None:
    watch = BatchWatch(limit_s=None)
    watch.seen(active=True, last_batch=1, now=0.0)
    assert watch.seen(active=True, last_batch=1, now=1e9) is None
