"""The control plane on fakeredis with fake graphs: queued swaps, what a swap waits for, and
transient Kafka errors. No Spark, no Kafka."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from kafka.errors import NodeNotReadyError, TopicAuthorizationFailedError

from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import (
    CurrentQuery,
    GraphRecord,
    GraphState,
    NodePosition,
    QueryKind,
    QuerySource,
    ServiceState,
)
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.contract.source import LEGACY_SOURCE, SourceSpec
from hotswap.contract.status import OwnerStatus
from hotswap.execution_graph.validation import QueryShape
from hotswap.executor.control.swap import SwapProtocol
from hotswap.executor.control.transient import TransientErrorsPersisted, retry_transient
from hotswap.executor.control.waits import recovered_queries, start_blocker, waiting_for
from hotswap.executor.operator.client import window_owners

WINDOWS = {"a": 10_000, "b": 30_000, "c": 20_000}


def source(name: str) -> QuerySource:
    return QuerySource(name=name, kind=QueryKind.SQL, text=f"-- {name}")


class FakeGraphs:
    """The part of executor.control.graphs.Graphs that the swap protocol uses, kept in a dict."""

    def __init__(self) -> None:
        self.saved: dict[str, GraphRecord] = {}
        self.current_id: str | None = None
        self.deployed: list[str] = []
        self.runner = self
        self.namespace_source = LEGACY_SOURCE

    def version_reads(self, source: QuerySource, predecessor: SourceSpec) -> SourceSpec:
        return predecessor

    def failure(self, query_id: str) -> str | None:
        return None

    def stop(self, query_id: str, *, finish_batch: bool = True) -> None:
        pass

    def last_commit_watermark(self, query_id: str) -> int | None:
        return None

    def records(self) -> dict[str, GraphRecord]:
        return dict(self.saved)

    def get(self, query_id: str) -> GraphRecord | None:
        return self.saved.get(query_id)

    def save(self, record: GraphRecord) -> None:
        self.saved[record.query_id] = record

    def current(self) -> CurrentQuery | None:
        return None if self.current_id is None else CurrentQuery(query_id=self.current_id, started_at=1)

    def set_current(self, record: GraphRecord) -> None:
        self.current_id = record.query_id

    def unique_id(self, name: str, taken: set[str]) -> str:
        n = 1
        while (f"{name}-{n}" if n > 1 else name) in set(self.saved) | taken:
            n += 1
        return f"{name}-{n}" if n > 1 else name

    def validate(self, query: QuerySource, running_window_ms: int | None, reads: SourceSpec) -> QueryShape:
        return QueryShape(window_ms=WINDOWS[query.name], columns=(), group_columns=())

    def deploy(self, record: GraphRecord) -> GraphRecord:
        self.deployed.append(record.query_id)
        running = record.model_copy(update={"state": GraphState.RUNNING})
        self.save(running)
        return running

    def discard(self, query_id: str) -> None:
        self.save(self.saved[query_id].model_copy(update={"state": GraphState.FAILED}))

    def retire(self, query_id: str) -> None:
        self.save(self.saved[query_id].model_copy(update={"state": GraphState.RETIRED}))


class FakeReporter:
    def forget(self, query_id: str) -> None:
        pass


@pytest.fixture
def world() -> tuple[SwapProtocol, Journal, FakeGraphs]:
    client = fakeredis.FakeRedis()
    graphs = FakeGraphs()
    graphs.save(GraphRecord(query_id="a", source=source("a"), window_ms=10_000, topic="t.a", state=GraphState.RUNNING))
    graphs.current_id = "a"
    settings = Settings(namespace="unit")
    protocol = SwapProtocol(settings, client, graphs, FakeReporter())  # type: ignore[arg-type]
    return protocol, Journal(client, Keys("unit")), graphs


def submit(journal: Journal, name: str) -> str:
    journal.create(SwapRecord(id=f"s-{name}", to_query=name, source=source(name)))
    return f"s-{name}"


def test_a_queued_swap_replaces_whatever_serves_when_its_turn_comes(world: Any) -> None:
    protocol, journal, graphs = world
    b, c = submit(journal, "b"), submit(journal, "c")
    protocol.step()  # validates both; b becomes active and deploys
    assert journal.get(b).state is SwapPhase.DEPLOYED
    assert journal.get(b).from_query == "a"
    assert journal.get(c).state is SwapPhase.VALIDATED
    assert journal.get(c).from_query is None  # not bound while queued
    journal.advance(b, SwapPhase.ABORTED, error="aborted by operator")
    protocol.step()
    assert journal.get(c).state is SwapPhase.DEPLOYED
    assert journal.get(c).from_query == "a"
    assert journal.get(c).old_window_ms == 10_000
    assert graphs.deployed == ["b", "c"]


def test_a_queued_swap_is_checked_again_against_its_real_predecessor(world: Any) -> None:
    protocol, journal, graphs = world
    queued = submit(journal, "c")  # 20 s windows (the fake validation checks nothing at submit)
    # Before its turn, a query with 13 s windows took over: a common boundary only every 260 s.
    graphs.save(GraphRecord(query_id="b", source=source("b"), window_ms=13_000, topic="t.b", state=GraphState.RUNNING))
    graphs.current_id = "b"
    protocol.step()
    failed = journal.get(queued)
    assert failed.state is SwapPhase.FAILED
    assert "share a boundary only every" in (failed.error or "")
    assert "checked against b" in (failed.error or "")
    assert graphs.deployed == []


def test_no_swap_starts_while_the_serving_query_is_down(world: Any) -> None:
    protocol, journal, graphs = world
    graphs.save(graphs.saved["a"].model_copy(update={"state": GraphState.FAILED}))
    b = submit(journal, "b")
    protocol.step()
    assert journal.get(b).state is SwapPhase.VALIDATED
    blocker = start_blocker(graphs.current(), graphs.records(), journal.all())
    assert blocker is not None
    assert "query a serves the windows after the last cut but is failed" in blocker
    said = waiting_for(journal.get(b), journal.all(), ServiceState(), {}, blocker)
    assert said == blocker


def test_waiting_for_names_the_watermark_the_cut_and_idle_partitions() -> None:
    swap = SwapRecord(id="s", to_query="b", from_query="a", state=SwapPhase.CUT, cut_window_end=10_000)
    service = ServiceState(
        watermark=5_000,
        partitions={"0": NodePosition(event_time=9_000), "2": NodePosition(idle=True), "3": NodePosition(idle=True)},
    )
    said = waiting_for(swap, [swap], service, {}, None)
    assert said == "drain: service watermark 00:00:05.000 < W 00:00:10.000; partitions 2, 3 idle"
    done = swap.model_copy(update={"state": SwapPhase.COMPLETED})
    assert waiting_for(done, [done], service, {}, None) is None


def test_transient_kafka_errors_are_retried_until_they_pass() -> None:
    calls = iter([NodeNotReadyError("1"), NodeNotReadyError("1"), "created"])
    slept: list[float] = []

    def action() -> str:
        outcome = next(calls)
        if isinstance(outcome, Exception):
            raise outcome
        return str(outcome)

    assert retry_transient(action, "creating topic t", 60, sleep=slept.append) == "created"
    assert slept == [0.2, 0.4]


def test_transient_errors_give_up_at_the_deadline_with_one_line() -> None:
    now = [0.0]

    def failing() -> None:
        raise NodeNotReadyError("1")

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(TransientErrorsPersisted) as gave_up:
        retry_transient(failing, "creating topic t", 10, clock=lambda: now[0], sleep=sleep)
    message = str(gave_up.value)
    assert message.startswith("creating topic t failed")
    assert "NodeNotReadyError" in message
    assert "\n" not in message
    assert now[0] <= 10


def test_permanent_kafka_errors_are_not_retried() -> None:
    def refused() -> None:
        raise TopicAuthorizationFailedError()

    with pytest.raises(TopicAuthorizationFailedError):
        retry_transient(refused, "creating topic t", 60, sleep=lambda _: pytest.fail("must not retry"))


def test_a_swap_cut_before_any_event_completes_without_waiting_for_output(world: Any) -> None:
    protocol, journal, graphs = world
    swap = submit(journal, "b")
    protocol.step()
    # The source never carried an event: the cut is at 0 and no window lies before it.
    journal.advance(swap, SwapPhase.CUT, cut_window_end=0, cut_batch=0)
    journal.advance(swap, SwapPhase.DRAINING)
    for _ in range(3):
        protocol.step()
    assert journal.get(swap).state is SwapPhase.COMPLETED
    assert graphs.current_id == "b"
    assert graphs.get("a").state is GraphState.RETIRED


def test_a_completed_swap_is_rolled_back_by_a_swap_back_and_ends_rolled_back(world: Any) -> None:
    protocol, journal, graphs = world
    forward = submit(journal, "b")
    protocol.step()
    journal.advance(forward, SwapPhase.CUT, cut_window_end=30_000, cut_batch=3)
    journal.advance(forward, SwapPhase.DRAINING)
    journal.advance(forward, SwapPhase.DRAINED)
    protocol.step()
    protocol.step()
    assert journal.get(forward).state is SwapPhase.COMPLETED
    # What `hotswap rollback` queues: the previous query's text, from the graph record.
    journal.create(SwapRecord(id="back", to_query="a", source=graphs.get("a").source, rollback_of=forward))
    protocol.step()
    assert journal.get("back").from_query == "b"
    journal.advance("back", SwapPhase.CUT, cut_window_end=60_000, cut_batch=9)
    journal.advance("back", SwapPhase.DRAINING)
    journal.advance("back", SwapPhase.DRAINED)
    for _ in range(3):
        protocol.step()
    assert journal.get("back").state is SwapPhase.COMPLETED
    assert journal.get(forward).state is SwapPhase.ROLLED_BACK
    assert graphs.current_id == "a-2"  # the previous query's text, as a new graph
    assert graphs.get("a-2").source == graphs.get("a").source
    assert window_owners(journal.all(), "a-2") == [
        OwnerStatus(query_id="a", after=None, through=30_000),
        OwnerStatus(query_id="b", after=30_000, through=60_000, swap_id=forward),
        OwnerStatus(query_id="a-2", after=60_000, through=None, swap_id="back"),
    ]


def test_a_swap_that_failed_after_its_cut_is_rolled_back_on_its_buffer(world: Any) -> None:
    protocol, journal, graphs = world
    forward = submit(journal, "b")
    protocol.step()
    journal.advance(forward, SwapPhase.CUT, cut_window_end=30_000, cut_batch=3)
    journal.advance(forward, SwapPhase.FAILED, error="query b kept failing")
    graphs.save(graphs.get("b").model_copy(update={"state": GraphState.FAILED}))
    graphs.current_id = "b"
    graphs.retire("a")  # the old graph emitted its windows through W
    back = SwapRecord(id="back", to_query="a", source=graphs.get("a").source, rollback_of=forward, recovers=forward)
    journal.create(back)
    for _ in range(6):
        protocol.step()
    done = journal.get("back")
    assert done.state is SwapPhase.COMPLETED
    assert done.from_query == "b"
    assert done.cut_window_end == 30_000  # b emitted nothing after W: a-2 answers every window after it
    taking_over = graphs.get("a-2")
    assert (taking_over.topic, taking_over.start_after) == (graphs.get("b").topic, 30_000)  # b's buffer
    assert journal.get(forward).state is SwapPhase.ROLLED_BACK
    assert graphs.current_id == "a-2"
    assert graphs.get("b").state is GraphState.RETIRED


def test_a_failed_query_claimed_by_a_recovery_never_runs_again_unless_the_recovery_ended_before_its_cut() -> None:
    failed = SwapRecord(id="f", to_query="b", state=SwapPhase.FAILED, cut_window_end=30_000)
    claiming = SwapRecord(id="r", to_query="a-2", recovers="f", state=SwapPhase.VALIDATED)
    assert recovered_queries([failed, claiming]) == {"b"}
    aborted = claiming.model_copy(update={"state": SwapPhase.ABORTED})
    assert recovered_queries([failed, aborted]) == set()
    died_after_taking_over = claiming.model_copy(update={"state": SwapPhase.FAILED, "cut_window_end": 30_000})
    assert recovered_queries([failed, died_after_taking_over]) == {"b"}
