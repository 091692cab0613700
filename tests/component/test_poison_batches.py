"""`poison_batches = dead_letter`: the serving query that fails for good on a batch moves that
batch's rows to the dead-letter topic, is restarted without them, and says so; once per batch, and
only for the query that serves."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hotswap.contract.models import GraphRecord, GraphState, SkippedRows
from hotswap.contract.names import SKIPPED
from hotswap.contract.records import read_counters
from hotswap.contract.settings import KafkaSettings, Settings
from hotswap.executor.control import graphs as graphs_module
from tests.component.fakes import World

pytestmark = pytest.mark.component

BATCH_7 = [
    SkippedRows(partition=0, start=120, end=180, batch_id=7),
    SkippedRows(partition=1, start=40, end=41, batch_id=7),
]


@pytest.fixture
def settings() -> Settings:
    return Settings(namespace="poison", query_restarts=1, query_restart_backoff="1s", poison_batches="dead_letter")


@pytest.fixture
def moved(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Sequence[SkippedRows]]]:
    """What was copied to the dead-letter topic (Kafka faked): one row per offset."""
    calls: list[tuple[str, Sequence[SkippedRows]]] = []

    def copy(
        kafka: KafkaSettings, topic: str, record: GraphRecord, rows: Sequence[SkippedRows], why: str, timeout_s: float
    ) -> int:
        calls.append((record.query_id, rows))
        return sum(r.end - r.start for r in rows)

    monkeypatch.setattr(graphs_module, "dead_letter_rows", copy)
    return calls


def test_the_serving_query_dead_letters_its_poison_batch_and_goes_on(
    world: World, moved: list[tuple[str, Sequence[SkippedRows]]]
) -> None:
    world.graphs.fake_runner.failing["a"] = BATCH_7

    world.fail_until_spent("a")

    assert moved == [("a", BATCH_7)]
    record = world.graphs.get("a")
    assert record is not None
    assert record.state is GraphState.RUNNING
    assert record.skipped == tuple(BATCH_7)  # recorded: every restart from now on skips these rows
    assert world.graphs.fake_runner.restarted[-1] == "a"
    counters = read_counters(world.client, world.keys)
    assert counters[f"{SKIPPED}a"] == 1
    assert counters["dead_letter:poison_batch"] == counters["dead_letter_records"] == 61


def test_a_batch_that_fails_again_without_its_rows_fails_the_query_for_good(
    world: World, moved: list[tuple[str, Sequence[SkippedRows]]]
) -> None:
    world.graphs.fake_runner.failing["a"] = BATCH_7
    world.fail_until_spent("a")
    world.fail_until_spent("a")  # the same batch 7 fails again: not the rows

    assert len(moved) == 1
    assert world.graph_state("a") is GraphState.FAILED


def test_a_new_version_that_fails_is_not_skipped_but_left_to_rollback_or_fix(
    world: World, moved: list[tuple[str, Sequence[SkippedRows]]]
) -> None:
    swap_id = world.submit("b")
    world.deploy(swap_id)
    world.graphs.fake_runner.failing["b"] = BATCH_7

    world.fail_until_spent("b")

    assert moved == []
    assert world.graph_state("b") is GraphState.FAILED


def test_off_by_default(moved: list[tuple[str, Sequence[SkippedRows]]]) -> None:
    world = World(Settings(namespace="poison-off", query_restarts=1, query_restart_backoff="1s"))
    world.serve("a")
    world.graphs.fake_runner.failing["a"] = BATCH_7

    world.fail_until_spent("a")

    assert moved == []
    assert world.graph_state("a") is GraphState.FAILED


OUTAGE = (
    "sink unavailable: postgres:results: connection failed: Connection refused; the batch is replayed once it is back"
)


def test_a_sink_that_stays_away_is_retried_then_fails_the_query_but_never_dead_letters_its_rows(
    world: World, moved: list[tuple[str, Sequence[SkippedRows]]]
) -> None:
    world.graphs.fake_runner.failing["a"] = BATCH_7
    runner = world.graphs.fake_runner
    for _ in range(world.settings.query_restarts + 3):  # an outage: retried without counting
        runner.die("a", OUTAGE)
        assert world.graphs.supervise() == []
        world.clock.advance(world.settings.query_restart_backoff.s)
        assert world.graphs.supervise() == []
    assert world.graph_state("a") is GraphState.RUNNING

    world.clock.advance(world.settings.retry_deadline.s + 1)  # still away past retry_deadline: counted now
    world.fail_until_spent("a", OUTAGE)

    assert moved == []  # the rows are not the fault: nothing dead-lettered
    assert world.graph_state("a") is GraphState.FAILED
