"""A graph's query leaves a task slot to the service graph and the other graphs (task_slots.py)."""

from __future__ import annotations

import pytest

from hotswap.execution_graph.task_slots import query_partitions


@pytest.mark.parametrize(
    ("configured", "slots", "expected"),
    [
        (2, 2, 1),  # local[2]: one slot for the query, one for the service graph
        (2, 8, 2),  # slots to spare: as configured
        (200, 16, 15),
        (4, 1, 1),  # local[1]: no slot to leave, the query still runs
        (3, 0, 3),  # a cluster whose executors have not registered yet: as configured
    ],
)
def test_a_graph_query_runs_at_most_one_task_fewer_than_the_slots(configured: int, slots: int, expected: int) -> None:
    assert query_partitions(configured, slots) == expected
