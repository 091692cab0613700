"""A graph's life through the real control plane (Spark and Kafka faked): a graph that never served
is recorded `discarded`, never `failed`; it owns nothing, an executor restart does not start it
again, and retention forgets it. A graph that failed for good after it served stays `failed`: it
keeps its windows."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import cast

import pytest

from hotswap.contract.journal import SwapPhase
from hotswap.contract.models import GraphState
from hotswap.contract.ownership import read_owned_windows
from hotswap.contract.settings import Settings
from hotswap.execution_graph.errors import GraphStartFailed
from hotswap.executor.control.controller import Executor
from hotswap.executor.control.retention import Retention
from tests.component.fakes import World

pytestmark = pytest.mark.component

W1 = 60_000


@pytest.fixture
def settings() -> Settings:
    return Settings(
        namespace="graph-states", query_restarts=1, query_restart_backoff="1s", cut_timeout="300s", journal_retention=1
    )


def resume(world: World) -> None:
    """What a restarted executor does with the graph records it finds (Executor._resume)."""
    current = world.graphs.current()
    assert current is not None
    executor = cast(Executor, SimpleNamespace(graphs=world.graphs, _redis=world.client, _keys=world.keys))
    Executor._resume(executor, current.query_id, world.journal.open(), world.graphs.records())


def test_the_graph_of_an_aborted_swap_is_discarded_and_owns_nothing(world: World) -> None:
    swap_id = world.submit("b", 30_000)
    world.deploy(swap_id)
    assert world.graph_state("b") is GraphState.RUNNING
    world.operator().abort(swap_id)
    world.protocol.step()
    b = world.graphs.get("b")
    assert b is not None
    assert (b.state, b.retired_at is not None) == (GraphState.DISCARDED, True)
    assert read_owned_windows(world.client, world.keys, b).ranges == ()
    assert world.settings.names.graph_topic("b") in world.graphs.fake_topics.deleted


def test_a_new_graph_that_failed_for_good_before_its_cut_is_discarded_when_its_swap_ends(world: World) -> None:
    swap_id = world.submit("b", 30_000)
    world.deploy(swap_id)
    world.fail_until_spent("b")
    assert world.graph_state("b") is GraphState.FAILED
    assert world.state(swap_id) is SwapPhase.DEPLOYED
    world.operator().abort(swap_id)
    world.protocol.step()
    assert world.graph_state("b") is GraphState.DISCARDED  # it never served: it keeps nothing


def test_a_query_that_failed_for_good_after_it_served_stays_failed_and_keeps_its_windows(world: World) -> None:
    swap_id = world.submit("b", 30_000)
    world.deploy(swap_id)
    assert world.complete(swap_id, W1).state is SwapPhase.COMPLETED
    world.fail_until_spent("b")
    b = world.graphs.get("b")
    assert b is not None
    assert (b.state, b.retired_at) == (GraphState.FAILED, None)
    assert read_owned_windows(world.client, world.keys, b).ranges == ((W1, None),)


def test_a_restarted_executor_resumes_what_serves_and_discards_what_never_served(world: World) -> None:
    aborted = world.submit("b", 30_000)
    world.deploy(aborted)
    world.operator().abort(aborted)
    world.protocol.step()
    assert world.graph_state("b") is GraphState.DISCARDED
    # A swap that failed before its cut, whose graph failed for good, then the executor stopped
    # before the swap's clean-up: its graph is left `failed`.
    left = world.submit("c", 30_000)
    world.deploy(left)
    world.fail_until_spent("c")
    world.journal.advance(left, SwapPhase.FAILED, error="no cut", when=lambda r: r.state is SwapPhase.DEPLOYED)
    assert world.graph_state("c") is GraphState.FAILED
    # The current query failed for good too: it still owns its windows.
    world.fail_until_spent("a")
    runner = world.graphs.fake_runner
    runner.started.clear()

    resume(world)

    assert runner.started == ["a"]  # failed, yet it serves: tried again
    assert world.graph_state("a") is GraphState.RUNNING  # the restart was its retry: swaps no longer wait on it
    assert world.graph_state("b") is GraphState.DISCARDED  # not started again
    assert world.graph_state("c") is GraphState.DISCARDED  # never served: discarded now


def test_a_restarted_executor_starts_its_graphs_side_by_side_and_raises_a_start_that_failed(world: World) -> None:
    """Each start reads a checkpoint and plans a user query (seconds in a cold executor): a restart
    in the middle of a swap serves again once the slower of its two graphs runs, not after both."""
    swap_id = world.submit("b", 30_000)
    world.deploy(swap_id)
    runner = world.graphs.fake_runner
    runner.started.clear()
    runner.start_together = threading.Barrier(2, timeout=10)

    resume(world)

    assert sorted(runner.started) == ["a", "b"]
    assert world.graph_state("a") is world.graph_state("b") is GraphState.RUNNING

    runner.start_together = threading.Barrier(2, timeout=10)
    runner.resume_fails["b"] = "checkpoint belongs to another Spark query"
    del runner.queries["a"], runner.queries["b"]
    with pytest.raises(GraphStartFailed, match=r"^execution graph b failed to start: checkpoint belongs"):
        resume(world)
    assert "a" in runner.queries  # the other start went on to the end


def test_retention_forgets_a_discarded_graph_with_its_swap(world: World) -> None:
    aborted = world.submit("b", 30_000)
    world.deploy(aborted)
    world.operator().abort(aborted)
    world.protocol.step()
    done = world.submit("c", 30_000)
    world.deploy(done)
    assert world.complete(done, W1).state is SwapPhase.COMPLETED

    Retention(world.settings.pipeline, world.journal, world.graphs, world.graphs.fake_topics).sweep()  # type: ignore[arg-type]

    assert [s.id for s in world.journal.all()] == [done]  # journal_retention = 1
    assert world.graphs.get("b") is None
    assert "b" in world.graphs.fake_runner.removed_checkpoints
    assert set(world.graphs.records()) == {"a", "c"}  # a is named by the kept swap


def test_a_restart_keeps_a_failed_graph_that_still_owns_windows_no_open_swap_names(world: World) -> None:
    """An old graph that failed for good in its drain served windows up to its swap's cut: once that
    swap ended (a rollback took over its new query), a restart must not discard what it still owes."""
    swap_id = world.submit("b", 30_000)
    world.deploy(swap_id)
    assert world.complete(swap_id, W1).state is SwapPhase.COMPLETED
    old = world.graphs.get("a")
    assert old is not None
    world.graphs.save(old.changed(state=GraphState.FAILED, retired_at=None))  # failed in its drain, never retired

    resume(world)

    assert world.graph_state("a") is GraphState.FAILED
    a = world.graphs.get("a")
    assert a is not None
    assert read_owned_windows(world.client, world.keys, a).ranges == ((None, W1),)
