"""The control plane on fakeredis with fake graphs: queued swaps, what a swap waits for, rollbacks
and recoveries, and transient Kafka errors. No Spark, no Kafka."""

from __future__ import annotations

import fakeredis
import pytest
from kafka.errors import NodeNotReadyError, TopicAuthorizationFailedError

from hotswap.contract.journal import Also, Journal, SwapPhase, SwapRecord, active_swap
from hotswap.contract.models import GraphRecord, GraphState, NodePosition, ServiceState
from hotswap.contract.names import Keys
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.status import OwnerStatus
from hotswap.executor.control.transient import TransientErrorsPersisted, retry_transient
from hotswap.executor.control.waits import graphs_to_start, start_blocker, waiting_for
from hotswap.executor.operator.client import window_owners
from tests.component.fakes import RacingRedis, World, graph_record, query

pytestmark = pytest.mark.component

P = SwapPhase
KEYS = Keys("component")


def graph(world: World, name: str, window_ms: int) -> GraphRecord:
    return graph_record(name, window_ms, world.settings.names.graph_topic(name))


def test_a_queued_swap_replaces_whatever_serves_when_its_turn_comes(world: World) -> None:
    b, c = world.submit("b", 30_000), world.submit("c", 20_000)
    world.deploy(b)  # validates both; b becomes active and deploys
    assert world.journal.get(b).state is SwapPhase.DEPLOYED
    assert world.journal.get(b).from_query == "a"
    assert world.journal.get(c).state is SwapPhase.VALIDATED
    assert world.journal.get(c).from_query is None  # not bound while queued
    world.operator().abort(b)
    world.deploy(c)
    assert world.journal.get(c).state is SwapPhase.DEPLOYED
    assert world.journal.get(c).from_query == "a"
    assert world.journal.get(c).old_window_ms == 10_000
    assert world.graphs.fake_runner.started == ["a", "b", "c"]
    assert world.graph_state("b") is GraphState.DISCARDED  # the aborted swap's graph is removed


def test_a_queued_swap_is_checked_again_against_its_real_predecessor(world: World) -> None:
    queued = world.submit("c", 20_000)  # 20 s windows, validated against a (10 s)
    world.protocol.step()
    # Before its turn, a query with 13 s windows took over: a common boundary only every 260 s.
    world.journal.advance(queued, SwapPhase.ABORTED)
    later = world.submit("c", 20_000)
    world.graphs.deploy_first(graph(world, "b", 13_000))
    world.protocol.step()
    failed = world.journal.get(later)
    assert (failed.state, failed.reason_code) == (SwapPhase.REJECTED, ReasonCode.WINDOWS_NOT_CUTTABLE)
    assert "share a boundary only every" in (failed.error or "")


def test_no_swap_starts_while_the_serving_query_is_down(world: World) -> None:
    world.graphs.save(world.graphs.get("a").changed(state=GraphState.FAILED))  # type: ignore[union-attr]
    b = world.submit("b", 30_000)
    world.deploy(b)
    assert world.journal.get(b).state is SwapPhase.VALIDATED
    swaps = world.journal.open()
    current = world.graphs.current()
    blocker = start_blocker(current, world.graphs.get_many(graphs_to_start(current, swaps)), swaps)
    assert blocker is not None
    assert "query a serves the windows after the last cut but is failed" in blocker
    said = waiting_for(world.journal.get(b), swaps, ServiceState(), {}, {}, blocker)
    assert said == f"its turn: {blocker}"


def test_waiting_for_names_the_watermark_the_cut_and_idle_partitions() -> None:
    swap = SwapRecord(id="s", to_query="b", from_query="a", state=SwapPhase.CUT, cut_window_end=10_000)
    service = ServiceState(
        watermark=5_000,
        partitions={"0": NodePosition(event_time=9_000), "2": NodePosition(idle=True), "3": NodePosition(idle=True)},
    )
    said = waiting_for(swap, [swap], service, {}, {}, None)
    assert said == "drain: service watermark 00:00:05.000 < W 00:00:10.000; partitions 2, 3 idle"
    draining = swap.model_copy(update={"state": SwapPhase.DRAINING})
    said = waiting_for(draining, [draining], service, {}, {"a": 7_000}, None)
    assert said == "a to emit its windows through W 00:00:10.000 (its watermark 00:00:07.000)"
    done = swap.model_copy(update={"state": SwapPhase.COMPLETED})
    assert waiting_for(done, [done], service, {}, {}, None) is None


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


def test_a_swap_cut_before_any_event_completes_without_waiting_for_output(world: World) -> None:
    swap = world.submit("b", 30_000)
    world.deploy(swap)
    # The source never carried an event: the cut is at 0 and no window lies before it.
    world.cut(swap, 0)
    assert world.state(swap) is SwapPhase.DRAINING  # reached at once, in the same tick
    world.protocol.step()  # drained, retired and completed in one step: nothing is left to wait for
    assert world.journal.get(swap).state is SwapPhase.COMPLETED
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "b"
    assert world.graph_state("a") is GraphState.RETIRED
    phases = [p.name for p in world.journal.get(swap).phases]
    assert phases[-4:] == [SwapPhase.DRAINED, SwapPhase.RETIRING, SwapPhase.RETIRED, SwapPhase.COMPLETED]


def test_a_completed_swap_is_rolled_back_by_a_swap_back_and_ends_rolled_back(world: World) -> None:
    forward = world.submit("b", 30_000)
    world.deploy(forward)
    assert world.complete(forward, 30_000).state is SwapPhase.COMPLETED
    # What `hotswap rollback` queues: the previous query's text, from the graph record.
    a = world.graphs.get("a")
    assert a is not None
    world.journal.create(SwapRecord(id="back", to_query="a", source=a.source, rollback_of=forward))
    world.deploy("back")
    assert world.journal.get("back").from_query == "b"
    done = world.complete("back", 60_000)
    assert done.state is SwapPhase.COMPLETED
    assert world.journal.get(forward).state is SwapPhase.ROLLED_BACK  # in the completing write
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "a-2"  # the previous query's text, as a new graph
    assert world.graphs.get("a-2").source == a.source  # type: ignore[union-attr]
    assert window_owners(world.journal.all(), "a-2") == [
        OwnerStatus(query_id="a", after=None, through=30_000),
        OwnerStatus(query_id="b", after=30_000, through=60_000, swap_id=forward),
        OwnerStatus(query_id="a-2", after=60_000, through=None, swap_id="back"),
    ]


def strand(world: World, name: str = "b", cut: int = 30_000) -> str:
    """A swap whose new query failed for good after its cut; its old graph emitted through W."""
    forward = world.submit(name, 30_000)
    world.deploy(forward)
    world.cut(forward, cut)
    record = world.graphs.get(name)
    assert record is not None
    world.graphs.fake_runner.stop(name)
    world.graphs.save(record.changed(state=GraphState.FAILED))
    world.protocol.graphs_failed([(record, "model server unreachable")])
    assert world.state(forward) is SwapPhase.STRANDED
    world.emitted_through("a", cut)
    world.watermark_passes_cut(forward)  # the old graph still gets its end-of-window marker
    world.protocol.step()  # its old graph drained: retired
    assert world.graph_state("a") is GraphState.RETIRED
    return forward


def test_a_stranded_swap_is_rolled_back_on_its_buffer(world: World) -> None:
    forward = strand(world)
    a = world.graphs.get("a")
    assert a is not None
    back = SwapRecord(id="back", to_query="a", source=a.source, rollback_of=forward, recovers=forward)
    world.journal.create(back)
    for _ in range(6):
        world.protocol.step()
    done = world.journal.get("back")
    assert done.state is SwapPhase.COMPLETED
    assert done.from_query == "b"
    assert done.cut_window_end == 30_000  # b emitted nothing after W: a-2 answers every window after it
    taking_over = world.graphs.get("a-2")
    b = world.graphs.get("b")
    assert taking_over is not None
    assert b is not None
    assert (taking_over.topic, taking_over.start_after) == (b.topic, 30_000)  # b's buffer
    assert world.journal.get(forward).state is SwapPhase.ROLLED_BACK
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "a-2"
    assert b.state is GraphState.RETIRED
    assert world.journal.open() == []


def test_a_stranded_swap_holds_back_the_queue_and_its_fix_goes_first(world: World) -> None:
    forward = strand(world)
    queued = world.submit("c", 10_000)
    world.protocol.step()
    assert world.state(queued) is SwapPhase.VALIDATED
    swaps = world.journal.open()
    current = world.graphs.current()
    blocker = start_blocker(current, world.graphs.get_many(graphs_to_start(current, swaps)), swaps)
    said = waiting_for(world.journal.get(queued), swaps, ServiceState(), {}, {}, blocker)
    assert said == (
        f"its turn: swap {forward} is stranded (its query b failed for good after its cut): "
        f"`hotswap rollback {forward}` or `hotswap submit FILE --fix {forward}` takes it over first"
    )
    fix = SwapRecord(id="fix", to_query="d", source=query("d", 10_000), recovers=forward)
    world.journal.create(fix)
    world.protocol.step()
    assert active_swap(world.journal.open()).id == "fix"  # type: ignore[union-attr]
    for _ in range(6):
        world.protocol.step()
    assert world.state("fix") is SwapPhase.COMPLETED
    assert world.state(forward) is SwapPhase.FIXED_FORWARD
    world.deploy(queued)
    assert world.journal.get(queued).from_query == "d"  # the queue resumes behind the fix


def test_a_completion_and_the_relabel_of_the_swap_it_undid_are_one_write() -> None:
    server = fakeredis.FakeServer()
    racing = RacingRedis(server=server)
    journal = Journal(racing, KEYS)
    other = Journal(fakeredis.FakeRedis(server=server), KEYS)
    journal.create(SwapRecord(id="undone", to_query="b"))
    for phase in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING, SwapPhase.DEPLOYED, SwapPhase.CUT):
        journal.advance("undone", phase, cut_window_end=30_000)
    journal.advance("undone", SwapPhase.STRANDED)
    journal.create(SwapRecord(id="back", to_query="a", recovers="undone", rollback_of="undone"))
    for phase in (P.VALIDATED, P.DEPLOYING, P.DEPLOYED, P.CUT, P.DRAINING, P.DRAINED, P.RETIRING, P.RETIRED):
        journal.advance("back", phase)
    # Another writer changes the undone swap after it was read: the whole write is refused, then redone.
    racing.rival = lambda: other.update("undone", markers_written=True)
    racing.writes = 0
    done = journal.advance("back", SwapPhase.COMPLETED, also=Also(relabel=("undone", SwapPhase.ROLLED_BACK)))
    assert done is not None
    assert racing.writes == 2
    undone = journal.get("undone")
    assert (undone.state, undone.markers_written) == (SwapPhase.ROLLED_BACK, True)
    assert journal.open() == []


def test_owners_follow_the_order_of_the_cuts_when_a_fix_goes_ahead_of_a_queued_swap(world: World) -> None:
    """Found by the soak: a → b completed, b then failed for good; c, queued before the fix, waits;
    the fix goes first and cuts earlier than c. Ownership follows the cuts, not the journal's order:
    reading it in the journal's order gave c's predecessor an empty range, and its windows were
    dropped by its result writer."""
    forward = world.submit("b", 10_000)
    world.deploy(forward)
    assert world.complete(forward, 30_000).state is SwapPhase.COMPLETED
    record = world.graphs.get("b")
    assert record is not None
    world.graphs.fake_runner.stop("b")
    world.graphs.save(record.changed(state=GraphState.FAILED))
    queued = world.submit("c", 10_000)
    world.protocol.step()
    assert world.state(queued) is SwapPhase.VALIDATED  # held back: b serves and has failed
    world.journal.create(SwapRecord(id="fix", to_query="d", source=query("d", 10_000), recovers=forward))
    world.emitted_through("b", 30_000)
    for _ in range(6):
        world.protocol.step()
    assert world.state("fix") is SwapPhase.COMPLETED
    world.deploy(queued)
    assert world.complete(queued, 60_000).state is SwapPhase.COMPLETED

    assert [s.id for s in world.journal.all()] == [forward, queued, "fix"]  # c was written before the fix
    assert window_owners(world.journal.all(), "c") == [
        OwnerStatus(query_id="a", after=None, through=30_000),
        OwnerStatus(query_id="b", after=30_000, through=30_000, swap_id=forward),
        OwnerStatus(query_id="d", after=30_000, through=60_000, swap_id="fix"),
        OwnerStatus(query_id="c", after=60_000, through=None, swap_id=queued),
    ]
