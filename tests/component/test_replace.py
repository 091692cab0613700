"""`hotswap replace FILE`: the serving query failed for good (a poison row) and no swap made it
current, so there is no swap to `--fix`; the replacement takes over its input from the end of the
last window it emitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotswap.contract.errors import HotswapError
from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.reasons import ReasonCode
from tests.component.fakes import World, query

pytestmark = pytest.mark.component


def fail_for_good(world: World, query_id: str) -> None:
    world.fail_until_spent(query_id)
    assert world.graph_state(query_id) is GraphState.FAILED


def replacing(world: World, query_id: str, name: str = "fixed") -> str:
    """What `hotswap replace` writes for the namespace's first query (then the executor validates it)."""
    world.journal.create(SwapRecord(id="r", to_query=name, source=query(name, 10_000), replaces=query_id))
    for _ in range(8):
        world.protocol.step()
    return "r"


def test_the_first_query_failed_for_good_is_replaced_from_the_end_of_its_last_window(world: World) -> None:
    fail_for_good(world, "a")
    world.emitted_through("a", 25_000)  # its windows through 20 s are out; the one ending at 30 s is not
    swap = world.journal.get(replacing(world, "a"))

    assert swap.state is SwapPhase.COMPLETED
    assert (swap.from_query, swap.to_query, swap.cut_window_end) == ("a", "fixed", 20_000)
    fixed = world.graphs.get("fixed")
    assert fixed is not None
    assert fixed.topic == world.settings.names.graph_topic("a")  # a's buffer
    assert fixed.start_after == 20_000
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "fixed"
    assert world.graph_state("a") is GraphState.RETIRED
    assert fixed.topic not in world.graphs.fake_topics.deleted  # the replacement reads it


def test_a_query_that_emitted_nothing_is_replaced_from_its_first_row(world: World) -> None:
    fail_for_good(world, "a")
    swap = world.journal.get(replacing(world, "a"))
    assert swap.state is SwapPhase.COMPLETED
    assert swap.cut_window_end == 0  # every window is the replacement's
    fixed = world.graphs.get("fixed")
    assert fixed is not None
    assert fixed.start_after == 0


def test_a_running_query_is_not_replaced(world: World, tmp_path: Path) -> None:
    swap = world.journal.get(replacing(world, "a"))
    assert swap.state is SwapPhase.FAILED
    assert swap.reason_code is ReasonCode.NOTHING_TO_RECOVER
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "a"
    fixed = tmp_path / "fixed.sql"
    fixed.write_text("SELECT 1")
    with pytest.raises(HotswapError, match="use `hotswap submit FILE` to swap it"):
        world.operator().replace(fixed)


def test_a_query_a_swap_made_current_is_taken_over_by_a_fix_of_that_swap(world: World) -> None:
    forward = world.submit("b", 10_000)
    world.deploy(forward)
    assert world.complete(forward, 30_000).state is SwapPhase.COMPLETED
    fail_for_good(world, "b")
    # Written by hand (the client sends a fix instead): the executor refuses to read b's topic from
    # its start, since the windows up to b's cut were a's.
    swap = world.journal.get(replacing(world, "b"))
    assert swap.state is SwapPhase.FAILED
    assert swap.reason_code is ReasonCode.NOTHING_TO_RECOVER
