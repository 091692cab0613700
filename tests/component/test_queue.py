"""Several swaps submitted at once: validated in submission order, run one at a time, each bound to
the query that really serves when its turn comes; aborted and rejected ones step aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotswap.contract.errors import TimeoutExpired
from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.executor.errors import Interrupted
from tests.component.fakes import World

pytestmark = pytest.mark.component

W1, W2, W3 = 60_000, 120_000, 180_000


def in_progress(world: World) -> list[str]:
    """Swaps past validation that have not ended: at most one may be there."""
    return [s.id for s in world.journal.open() if s.state.is_in_flight and s.state is not SwapPhase.VALIDATED]


def test_queued_swaps_are_validated_in_submission_order(world: World) -> None:
    first = world.submit("b", 30_000)
    second = world.submit("b", 30_000)  # the same query name again
    third = world.submit("c", 20_000)
    world.protocol.step()
    assert world.graphs.validated == ["b", "b", "c"]
    assert [world.journal.get(s).to_query for s in (first, second, third)] == ["b", "b-2", "c"]
    assert world.state(first) is SwapPhase.DEPLOYING  # its graph started; the next step sees it run
    world.protocol.step()
    assert world.state(first) is SwapPhase.DEPLOYED
    assert world.state(second) is SwapPhase.VALIDATED
    assert world.state(third) is SwapPhase.VALIDATED


def test_swaps_run_one_at_a_time_each_replacing_its_real_predecessor(world: World) -> None:
    b, c, d = world.submit("b", 30_000), world.submit("c", 20_000), world.submit("d", 10_000)
    for swap_id, boundary in ((b, W1), (c, W2), (d, W3)):
        world.deploy(swap_id)  # its turn
        assert in_progress(world) == [swap_id]
        queued = [s for s in world.journal.all() if s.state is SwapPhase.VALIDATED]
        assert all(s.from_query is None for s in queued)  # not bound while queued
        done = world.complete(swap_id, boundary)
        assert done.state is SwapPhase.COMPLETED

    assert [world.journal.get(s).from_query for s in (b, c, d)] == ["a", "b", "c"]
    assert [world.journal.get(s).old_window_ms for s in (b, c, d)] == [10_000, 30_000, 20_000]
    assert world.graphs.fake_runner.started == ["a", "b", "c", "d"]
    assert [world.graph_state(q) for q in "abcd"] == [GraphState.RETIRED] * 3 + [GraphState.RUNNING]
    # A drained graph has nothing left to emit: its batch in flight is cancelled, not waited for.
    assert world.graphs.fake_runner.cancelled == ["a", "b", "c"]
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "d"


def test_an_aborted_queued_swap_is_skipped_and_its_successor_replaces_the_query_before_it(world: World) -> None:
    b, c, d = world.submit("b", 30_000), world.submit("c", 20_000), world.submit("d", 10_000)
    world.deploy(b)
    world.operator().abort(c)  # `hotswap abort` while c waits its turn

    world.complete(b, W1)
    world.deploy(d)

    assert world.state(c) is SwapPhase.ABORTED
    assert world.state(d) is SwapPhase.DEPLOYED
    assert world.journal.get(d).from_query == "b"
    assert "c" not in world.graphs.fake_runner.started
    assert world.graph_state("c") is GraphState.DISCARDED  # never served: discarded, its topic removed
    assert world.settings.names.graph_topic("c") in world.graphs.fake_topics.deleted


def test_a_rejected_swap_does_not_block_the_swaps_behind_it(world: World) -> None:
    world.graphs.refuse["b"] = "query 'b' does not analyse: column kye not found"
    b, c = world.submit("b", 30_000), world.submit("c", 20_000)
    world.deploy(c)
    assert world.state(b) is SwapPhase.REJECTED
    assert world.state(c) is SwapPhase.DEPLOYED
    assert world.journal.get(c).from_query == "a"


def test_a_queued_swap_that_cannot_be_cut_against_its_real_predecessor_fails_and_the_next_one_runs(
    settings: Settings,
) -> None:
    world = World(settings)
    world.serve("a", 11_000)
    b = world.submit("b", 143_000)  # 11 s -> 143 s: a common boundary every 143 s
    world.deploy(b)
    c = world.submit("c", 13_000)  # validated against b (143 s), the query queued before it
    d = world.submit("d", 143_000)  # cuttable after c (13 s) and after a (11 s)
    world.protocol.step()
    assert [world.state(s) for s in (b, c, d)] == [SwapPhase.DEPLOYED, SwapPhase.VALIDATED, SwapPhase.VALIDATED]

    world.operator().abort(b)
    world.protocol.step()  # c's turn: a serves, and 11 s and 13 s meet only every 143 s

    failed = world.journal.get(c)
    assert failed.state is SwapPhase.FAILED
    assert failed.reason_code is ReasonCode.WINDOWS_NOT_CUTTABLE
    assert "window sizes 11s and 13s share a boundary only every 143s" in (failed.error or "")
    assert "(checked against a, which serves now)" in (failed.error or "")
    assert "c" not in world.graphs.fake_runner.started
    world.deploy(d)
    assert world.state(d) is SwapPhase.DEPLOYED
    assert world.journal.get(d).from_query == "a"


def test_swaps_submitted_in_the_same_step_are_each_checked_against_the_one_queued_before_it(
    settings: Settings,
) -> None:
    world = World(settings)
    world.serve("a", 11_000)
    b = world.submit("b", 143_000)  # 11 s -> 143 s
    c = world.submit("c", 13_000)  # 143 s -> 13 s is cuttable; 11 s -> 13 s would not be
    world.deploy(b)
    assert world.state(b) is SwapPhase.DEPLOYED
    assert world.state(c) is SwapPhase.VALIDATED, world.journal.get(c).error


def test_a_submit_that_times_out_or_is_interrupted_withdraws_its_swap(world: World, tmp_path: Path) -> None:
    """`submit` says "not validated" only about a swap that will not run later."""
    query = tmp_path / "b.sql"
    query.write_text("30000")
    world.client.set(world.keys.lease, "executor-1")  # an executor holds the namespace, but never steps
    client = world.operator()
    with pytest.raises(TimeoutExpired, match="so it is withdrawn and nothing changed"):
        client.submit(query, validation_timeout_s=0.5)
    [timed_out] = world.journal.all()
    assert timed_out.state is SwapPhase.ABORTED

    def interrupted(*args: object, **kwargs: object) -> SwapRecord:
        raise KeyboardInterrupt

    client.wait_for = interrupted  # type: ignore[method-assign]  # Ctrl-C while submit waits
    with pytest.raises(Interrupted, match="is withdrawn, nothing changed"):
        client.submit(query)
    assert [s.state for s in world.journal.all()] == [SwapPhase.ABORTED, SwapPhase.ABORTED]
    world.protocol.step()
    assert world.graphs.validated == []  # neither is ever analysed
