"""Shadow runs through the real control plane and service graph tick (Spark and Kafka faked): the
shadow starts at S, receives rows beside the current query, is promoted with no deploy at a W at or
after S, and completes like any swap; or it is aborted and nothing the user sees changes."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.records import read_service_state
from hotswap.contract.settings import Settings
from hotswap.service_graph.routing import plan_batch, routing_swap, shadowing_swap
from tests.component.fakes import World, query

pytestmark = pytest.mark.component


def shadow(world: World, name: str = "b", window_ms: int = 10_000) -> str:
    swap_id = f"shadow-{name}"
    world.journal.create(SwapRecord(id=swap_id, to_query=name, source=query(name, window_ms), shadow=True))
    world.deploy(swap_id)
    return swap_id


def plan(world: World) -> list[tuple[str, int | None, int | None]]:
    """Who the next batch's rows go to: (graph, since, until)."""
    swaps = world.journal.all()
    graphs = world.graphs.records()
    current = world.graphs.current()
    state = read_service_state(world.client, world.keys)
    routed = plan_batch(
        1, state, graphs.get(current.query_id) if current else None, routing_swap(swaps), graphs,
        shadow=shadowing_swap(swaps),
    )  # fmt: skip
    return [(d.query_id, d.since, d.until) for d in routed.destinations]


def test_a_shadow_starts_at_s_and_receives_every_row_beside_the_current_query(world: World) -> None:
    swap_id = shadow(world)
    assert world.state(swap_id) is SwapPhase.DEPLOYED  # deployed as any new graph, not cut
    world.service_state(window_end=40_000)
    world.service.tick()
    started = world.journal.get(swap_id)
    assert started.state is SwapPhase.SHADOWING
    assert started.shadow_since == 40_000  # the first boundary a graph deployed now could own
    assert started.cut_window_end is None
    assert plan(world) == [("a", None, None), ("b", 40_000, None)]
    b = world.graphs.get("b")
    assert b is not None
    assert b.shadow_results_topic == world.settings.names.shadow_results_topic("b")
    # It waits for an operator, not for a deadline: time passing changes nothing.
    world.clock.advance(world.settings.cut_timeout.s * 2)
    for _ in range(3):
        world.protocol.step()
        world.service.tick()
    assert world.state(swap_id) is SwapPhase.SHADOWING
    assert world.graphs.fake_runner.started == ["a", "b"]


def test_promotion_cuts_at_or_after_s_with_no_deploy_and_completes(world: World) -> None:
    swap_id = shadow(world, "b", 30_000)
    world.service_state(window_end=40_000)
    world.service.tick()
    assert world.journal.get(swap_id).shadow_since == 60_000  # both grids: 10 s and 30 s
    world.service_state(window_end=70_000)
    world.operator().promote(swap_id)
    assert world.journal.get(swap_id).promote
    world.service.tick()
    cut = world.journal.get(swap_id)
    assert cut.state is SwapPhase.CUT
    assert cut.cut_window_end == 90_000  # the first common boundary at or after max(S, E)
    # The old graph keeps the rows before W; the promoted shadow keeps receiving from S on.
    assert plan(world) == [("a", None, 90_000), ("b", 60_000, None)]
    world.watermark_passes_cut(swap_id)
    world.emitted_through("a", 90_000)
    for _ in range(4):
        world.protocol.step()
    assert world.state(swap_id) is SwapPhase.COMPLETED
    assert world.graphs.fake_runner.started == ["a", "b"]  # promoted, never deployed again
    assert world.graph_state("a") is GraphState.RETIRED
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "b"


def test_promotion_of_a_shadow_that_never_started_is_refused_with_the_reason(world: World) -> None:
    swap_id = shadow(world)
    api = world.operator()
    with pytest.raises(Exception, match="only a shadow that has started"):
        api.promote(swap_id)
    plain = world.submit("c", 10_000)
    with pytest.raises(Exception, match="is not a shadow"):
        api.promote(plain)


def test_an_aborted_shadow_leaves_the_current_query_as_it_was(world: World) -> None:
    swap_id = shadow(world)
    world.service_state(window_end=40_000)
    world.service.tick()
    world.operator().abort(swap_id)
    world.protocol.step()
    assert world.state(swap_id) is SwapPhase.ABORTED
    assert plan(world) == [("a", None, None)]
    assert world.graphs.fake_runner.stopped.count("b") >= 1
    assert world.graph_state("b") is GraphState.DISCARDED  # it never served
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "a"


def test_a_shadow_whose_query_dies_fails_and_the_current_query_serves_on(world: World) -> None:
    swap_id = shadow(world)
    world.service_state(window_end=40_000)
    world.service.tick()
    world.graphs.fake_runner.die("b", "[DIVIDE_BY_ZERO] Division by zero")
    world.protocol.step()
    failed = world.journal.get(swap_id)
    assert failed.state is SwapPhase.FAILED
    assert failed.error is not None
    assert "[DIVIDE_BY_ZERO] Division by zero" in failed.error
    assert plan(world) == [("a", None, None)]
    assert world.graph_state("b") is GraphState.DISCARDED


def test_a_shadow_is_rejected_where_results_go_to_a_postgres_table(settings: Settings) -> None:
    table = settings.model_copy(update={"sink": "postgres:results", "sink_url": SecretStr("postgresql://db/x")})
    world = World(table)
    world.serve("a", 10_000)
    swap_id = shadow(world)
    rejected = world.journal.get(swap_id)
    assert rejected.state is SwapPhase.REJECTED
    assert rejected.reason_code is ReasonCode.SHADOW_NEEDS_KAFKA_SINK
    assert rejected.error == (
        "a shadow needs a Kafka sink; this namespace writes its results to postgres:results: submit without --shadow"
    )
    assert world.graphs.fake_runner.started == ["a"]
