"""Every wait ends when its time is up, in its own reason code: here the ones past deploy and cut
(those are in test_failures.py and test_admission.py): a promoted shadow that gets no cut, a dry run
whose analysis does not end, and an old query that does not stop when it retires."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.names import Keys
from hotswap.contract.plans import DryRunPlan, DryRunRequest
from hotswap.contract.reasons import ReasonCode
from hotswap.executor.control.dry_run import DryRuns
from tests.component.fakes import NO_SPARK, ManualClock, World, query

pytestmark = pytest.mark.component

W = 30_000


def test_a_promoted_shadow_that_gets_no_cut_within_the_cut_timeout_fails(world: World) -> None:
    swap_id = "shadow-b"
    world.journal.create(SwapRecord(id=swap_id, to_query="b", source=query("b", 10_000), shadow=True))
    world.deploy(swap_id)
    world.service_state(window_end=20_000)
    world.service.tick()
    assert world.state(swap_id) is SwapPhase.SHADOWING
    world.operator().promote(swap_id)
    world.protocol.step()  # the wait for the cut starts
    world.clock.advance(world.settings.cut_timeout.s + 1)  # no batch, no tick of the service graph since
    world.protocol.step()
    record = world.journal.get(swap_id)
    assert (record.state, record.reason_code) == (SwapPhase.FAILED, ReasonCode.CUT_TIMEOUT)
    assert (record.error or "").startswith("promoted, but no cut within 300s (cut_timeout)")
    assert world.graph_state("a") is GraphState.RUNNING


def test_a_dry_run_whose_analysis_does_not_end_is_answered_at_the_validation_timeout(world: World) -> None:
    never: Future[DryRunPlan] = Future()  # an analysis that never ends (a .py query that sleeps)
    clock = ManualClock()
    dry_runs = DryRuns(
        NO_SPARK,
        world.client,
        world.graphs,
        lambda work, name: never,
        clock,
        pipeline=world.settings.pipeline,
        kafka=world.settings.kafka,
        timeouts=world.settings.timeouts,
    )
    keys = Keys(world.settings.namespace)
    request = DryRunRequest(id="d1", source=query("slow", 10_000))
    world.client.set(keys.dry_run(request.id), request.model_dump_json())
    world.client.lpush(keys.dry_runs, request.id)

    dry_runs.answer_pending()  # taken: its analysis starts on a worker
    clock.advance(world.settings.validation_timeout.s)
    dry_runs.answer_pending()
    assert world.client.get(keys.dry_run_plan(request.id)) is None  # exactly the timeout: still waiting
    clock.advance(1)
    dry_runs.answer_pending()
    raw = world.client.get(keys.dry_run_plan(request.id))
    assert raw is not None
    plan = DryRunPlan.model_validate_json(raw)
    assert (plan.valid, plan.reason_code) == (False, ReasonCode.VALIDATION_TIMEOUT)
    assert "was not validated within 120s (validation_timeout)" in (plan.reason or "")


def test_an_old_query_that_does_not_stop_is_retired_at_the_retire_timeout(world: World) -> None:
    hung = threading.Event()
    world.graphs.fake_runner.stop_hangs["a"] = hung  # Spark's stop() does not return: a hung task
    world.graphs.stop_wait_s = 0.01
    try:
        swap_id = world.submit("b", 10_000)
        world.deploy(swap_id)
        world.cut(swap_id, W)
        world.watermark_passes_cut(swap_id)
        world.emitted_through("a", W)
        for _ in range(3):
            world.protocol.step()
        assert world.state(swap_id) is SwapPhase.RETIRING  # the loop goes on; the stop runs on its own thread
        world.clock.advance(world.settings.retire_timeout.s + 1)
        world.protocol.step()
        record = world.journal.get(swap_id)
        assert record.state is SwapPhase.COMPLETED  # a drained query owns nothing more: the swap ends
        assert world.graph_state("a") is GraphState.RETIRED
        current = world.graphs.current()
        assert current is not None
        assert current.query_id == "b"
    finally:
        hung.set()
