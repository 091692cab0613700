"""A graph's life (docs/architecture.md): its states, the one table of their moves, and the one
function that moves a graph, which refuses a move the table does not allow."""

from __future__ import annotations

import ast

import pytest

from hotswap.contract.models import (
    GRAPH_TRANSITIONS,
    GraphRecord,
    GraphState,
    IllegalGraphMove,
    QueryKind,
    QuerySource,
    new_spark_query_id,
)
from tests.conftest import DEMO_SOURCE
from tests.layout import modules

S = GraphState

# Every legal move, written out here rather than read from the table, so that a new one is seen.
LEGAL = {
    (S.STARTING, S.RUNNING),  # deployed: its query runs
    (S.STARTING, S.FAILED),  # its restarts were spent before it was seen running
    (S.STARTING, S.DISCARDED),  # its swap ended before the cut (aborted, failed to deploy)
    (S.RUNNING, S.FAILED),  # failed for good: it keeps what it owns
    (S.RUNNING, S.RETIRED),  # drained and stopped by the swap that replaced it
    (S.RUNNING, S.DISCARDED),  # a new graph (or a shadow) whose swap ended before the cut
    (S.FAILED, S.RUNNING),  # resumed by an executor restart, and seen running by its deploy
    (S.FAILED, S.RETIRED),  # taken over by a rollback or fix, which retires it
    (S.FAILED, S.DISCARDED),  # failed before its swap's cut: it never served
}


def graph(state: GraphState, **fields: object) -> GraphRecord:
    return GraphRecord(
        query_id="g",
        source=QuerySource(name="g", kind=QueryKind.SQL, text="-- g"),
        window_ms=10_000,
        slide_ms=10_000,
        topic="t",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
        state=state,
        **fields,
    )


def test_the_table_has_a_row_for_every_state_and_exactly_the_legal_moves() -> None:
    assert set(GRAPH_TRANSITIONS) == set(GraphState)
    assert {(a, b) for a, nexts in GRAPH_TRANSITIONS.items() for b in nexts} == LEGAL


def test_a_retired_or_discarded_graph_never_moves_again() -> None:
    assert {s for s in GraphState if s.is_ended} == {S.RETIRED, S.DISCARDED}
    for ended in (S.RETIRED, S.DISCARDED):
        assert GRAPH_TRANSITIONS[ended] == frozenset()


@pytest.mark.parametrize(("state", "target"), sorted({(a, b) for a in GraphState for b in GraphState} - LEGAL, key=str))
def test_a_move_the_table_does_not_allow_is_refused(state: GraphState, target: GraphState) -> None:
    assert not state.can_become(target)
    with pytest.raises(IllegalGraphMove, match=f"graph g cannot go from {state} to {target}"):
        graph(state).moved(target)


def test_a_move_stamps_the_first_start_and_the_end() -> None:
    running = graph(S.STARTING).moved(S.RUNNING)
    assert running.state is S.RUNNING
    assert running.started_at is not None
    assert running.retired_at is None
    again = graph(S.FAILED, started_at=1).moved(S.RUNNING)
    assert again.started_at == 1  # the first start is kept
    for ended in (S.RETIRED, S.DISCARDED):
        moved = graph(S.RUNNING, started_at=1).moved(ended)
        assert (moved.state, moved.started_at) == (ended, 1)
        assert moved.retired_at is not None
    assert graph(S.RUNNING).moved(S.FAILED).retired_at is None  # failed, it still owns its windows


def test_only_moved_changes_a_graphs_state_in_hotswaps_code() -> None:
    """No module of the rooms writes `state=GraphState...` by hand (contract/models.py, where
    `moved` lives, excepted): every change of a graph's state goes through the table."""
    by_hand = []
    for module, path in modules().items():
        if module == "hotswap.contract.models":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "state" and "GraphState" in ast.unparse(node.value):
                by_hand.append(f"{path.name}:{node.value.lineno}")
    assert by_hand == []
