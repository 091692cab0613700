"""Retention: a namespace that swaps for months keeps a bounded journal, graph records, checkpoints
and topics, and forgets nothing that still serves or is still named."""

from __future__ import annotations

import pytest

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.ownership import read_owned_windows
from hotswap.contract.settings import Settings
from hotswap.executor.control.retention import Retention
from tests.component.fakes import FakeTopics, World, query

pytestmark = pytest.mark.component


def retention(world: World) -> Retention:
    return Retention(world.settings.pipeline, world.journal, world.graphs, world.graphs.fake_topics)  # type: ignore[arg-type]


def swap_through(world: World, names: list[str]) -> list[str]:
    """Swap to each query in turn, each cut 10 s after the one before; returns the swap ids."""
    ids = []
    for n, name in enumerate(names, start=1):
        swap_id = world.submit(name)
        world.deploy(swap_id)
        assert world.complete(swap_id, 10_000 * n).state is SwapPhase.COMPLETED
        ids.append(swap_id)
    return ids


@pytest.fixture
def settings() -> Settings:
    return Settings(namespace="retention", journal_retention=2, query_restarts=2, cut_timeout="300s")


def test_old_swaps_and_their_retired_graphs_are_forgotten_and_the_serving_one_is_not(world: World) -> None:
    ids = swap_through(world, ["b", "c", "d", "e", "f"])
    current = world.graphs.get("f")
    assert current is not None
    owned_before = read_owned_windows(world.client, world.keys, current)

    retention(world).sweep()

    assert [s.id for s in world.journal.all()] == ids[-2:]  # the newest two ended swaps
    assert set(world.graphs.records()) == {"d", "e", "f"}  # d and e are named by the kept swaps
    assert sorted(world.graphs.fake_runner.removed_checkpoints) == ["a", "b", "c"]
    for gone in ("a", "b", "c"):
        assert not world.client.exists(world.keys.progress(gone))
    assert read_owned_windows(world.client, world.keys, current) == owned_before  # f serves windows after 50 s


def test_the_redis_keys_stop_growing_with_swaps(world: World) -> None:
    sweeper = retention(world)
    counts = []
    for round_ in range(4):
        names = [f"q{round_}x{i}" for i in range(3)]
        for n, name in enumerate(names, start=1):
            swap_id = world.submit(name)
            world.deploy(swap_id)
            world.complete(swap_id, 10_000 * (round_ * 3 + n))
        sweeper.sweep()
        counts.append(len(world.client.keys("*")))
    assert counts[1] == counts[2] == counts[3], counts


def test_a_topic_that_came_back_is_deleted_again_and_live_ones_are_kept(world: World) -> None:
    swap_through(world, ["b", "c"])
    world.submit("d")
    topics: FakeTopics = world.graphs.fake_topics
    names = world.settings.names
    topics.existing.add(names.graph_topic("a"))  # a marker sent just before the delete recreated it
    world.protocol.step()  # a swap under way: its graph is deploying

    retention(world).sweep()

    assert names.graph_topic("a") not in topics.existing
    assert {names.graph_topic("c"), names.graph_topic("d")} <= topics.existing


def test_a_forgotten_query_id_is_never_given_again(world: World) -> None:
    swap_through(world, ["b", "c", "d", "e"])
    retention(world).sweep()
    assert world.graphs.get("b") is None  # forgotten

    swap_id = world.submit("b")
    world.protocol.step()

    assert world.journal.get(swap_id).to_query == "b-2"


def test_a_query_that_failed_and_still_owes_windows_is_kept(world: World) -> None:
    swap_through(world, ["b", "c", "d"])
    failed = world.graphs.get("d")
    assert failed is not None
    world.graphs.save(failed.changed(state=GraphState.FAILED))  # failed for good: it still owns its windows
    for name in ("e", "f", "g"):
        world.journal.create(SwapRecord(id=f"x-{name}", to_query=name, source=query(name), state=SwapPhase.SUBMITTED))
        world.journal.advance(f"x-{name}", SwapPhase.REJECTED, when=lambda r: r.state is SwapPhase.SUBMITTED)

    retention(world).sweep()

    assert world.graphs.get("d") is not None
    assert "d" not in world.graphs.fake_runner.removed_checkpoints
    assert any(s.to_query == "d" for s in world.journal.all())  # the swap that made it serve stays
