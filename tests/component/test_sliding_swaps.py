"""Sliding windows through the swap protocol (issue 22, section 3): the slides a swap records, and a
recovery that takes over a sliding query's buffer, on the control plane's real code (fakes.py)."""

from __future__ import annotations

import pytest

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.records import read_service_state
from hotswap.contract.windows import Windowing
from tests.component.fakes import World, query

pytestmark = pytest.mark.component

SLIDING_30_10 = Windowing.of(30_000, 10_000)


def test_slides_are_recorded_at_validation_and_when_the_swap_starts(world: World) -> None:
    swap_id = world.submit("s", 30_000, slide_ms=10_000)
    started = world.deploy(swap_id)
    assert started.state is SwapPhase.DEPLOYED
    assert (started.new_window_ms, started.new_slide_ms) == (30_000, 10_000)
    assert (started.old_window_ms, started.old_slide_ms) == (10_000, 10_000)
    graph = world.graphs.get("s")
    assert graph is not None
    assert graph.windowing == SLIDING_30_10


def strand_sliding(world: World) -> str:
    """a (10 s) -> s (30 s every 10 s) cut at 30 s, then s failed for good before emitting a window:
    its buffer holds the rows from 10 s (30 s - 20 s) on. a emitted through W and is retired."""
    swap_id = world.submit("s", 30_000, slide_ms=10_000)
    world.deploy(swap_id)
    # The largest window routed ends at 10 s: s's first window after W must start at or after it.
    world.service_state(window_end=10_000)
    world.service.tick()
    assert world.journal.get(swap_id).cut_window_end == 30_000
    record = world.graphs.get("s")
    assert record is not None
    world.graphs.fake_runner.stop("s")
    world.graphs.save(record.changed(state=GraphState.FAILED))
    world.protocol.graphs_failed([(record, "query s kept failing")])
    assert world.state(swap_id) is SwapPhase.STRANDED
    world.emitted_through("a", 30_000)
    world.watermark_passes_cut(swap_id)
    world.protocol.step()
    assert world.graph_state("a") is GraphState.RETIRED
    return swap_id


def test_a_sliding_query_may_take_over_a_buffer_that_holds_its_first_windows_rows(world: World) -> None:
    stranded = strand_sliding(world)
    world.journal.create(SwapRecord(id="fix", to_query="s2", source=query("s2", 30_000, 10_000), recovers=stranded))
    for _ in range(6):
        world.protocol.step()
    assert world.state("fix") is SwapPhase.COMPLETED, world.journal.get("fix").error
    assert world.state(stranded) is SwapPhase.FIXED_FORWARD
    taking_over, failed = world.graphs.get("s2"), world.graphs.get("s")
    assert taking_over is not None
    assert failed is not None
    # It reads the failed query's topic from 10 s on, and owns the windows ending after 30 s.
    assert (taking_over.topic, taking_over.start_after, taking_over.reads_from) == (failed.topic, 30_000, 10_000)


def test_a_sliding_query_reaching_before_the_buffer_is_refused_with_the_reason(world: World) -> None:
    stranded = strand_sliding(world)
    world.journal.create(SwapRecord(id="fix", to_query="wide", source=query("wide", 40_000, 10_000), recovers=stranded))
    for _ in range(3):
        world.protocol.step()
    refused = world.journal.get("fix")
    assert (refused.state, refused.reason_code) == (SwapPhase.FAILED, ReasonCode.RECOVERY_NOT_ALIGNED)
    assert refused.error is not None
    assert "40s every 10s windows ending after 00:00:30.000 need rows from 00:00:00.000" in refused.error
    assert "the buffer of s starts at 00:00:10.000" in refused.error
    assert world.state(stranded) is SwapPhase.STRANDED  # still waiting for a rollback or a fix that fits


def test_a_swap_away_from_a_sliding_query_with_auto_rollback_keeps_what_its_rollback_needs(world: World) -> None:
    """a (10 s) -> s (30 s every 10 s) -> p (10 s, --auto-rollback), and p fails for good on every
    row: the rollback to s needs rows from W - 20 s, so p's cut comes 20 s later than p's own windows
    would need, and p's buffer starts at W - 20 s. (Found by the soak: the rollback was refused with
    recovery_not_aligned, and the namespace waited for an operator.)"""
    to_sliding = world.submit("s", 30_000, slide_ms=10_000)
    world.deploy(to_sliding)
    world.service_state(window_end=10_000)
    world.service.tick()
    assert world.journal.get(to_sliding).cut_window_end == 30_000
    world.watermark_passes_cut(to_sliding)
    world.emitted_through("a", 30_000)
    for _ in range(3):
        world.protocol.step()
    assert world.state(to_sliding) is SwapPhase.COMPLETED

    world.journal.create(SwapRecord(id="p", to_query="p", source=query("p", 10_000), auto_rollback=True))
    world.deploy("p")
    world.service_state(window_end=60_000)
    world.service.tick()
    cut = world.journal.get("p")
    assert cut.cut_window_end == 80_000  # >= 60 s + 20 s (s's reach), not 60 s
    assert cut.buffer_from == 60_000
    swaps = world.journal.open()
    plan = world.service._next_plan(1, read_service_state(world.client, world.keys), swaps)
    receivers = {d.query_id: d for d in plan.destinations}
    assert receivers["p"].since == 60_000  # the rows s's windows after W need go to p's topic too

    world.watermark_passes_cut("p")
    world.emitted_through("s", 80_000)
    for _ in range(3):
        world.protocol.step()
    assert world.state("p") is SwapPhase.COMPLETED
    record = world.graphs.get("p")
    assert record is not None
    world.graphs.fake_runner.stop("p")
    world.graphs.save(record.changed(state=GraphState.FAILED))
    world.protocol.graphs_failed([(record, "query p kept failing")])
    for _ in range(8):
        world.protocol.step()
    back = next(s for s in world.journal.all() if s.rollback_of == "p")
    assert back.state is SwapPhase.COMPLETED, back.error
    assert world.state("p") is SwapPhase.ROLLED_BACK
    taking_over = world.graphs.get(back.to_query)
    assert taking_over is not None
    assert (taking_over.start_after, taking_over.reads_from) == (80_000, 60_000)
