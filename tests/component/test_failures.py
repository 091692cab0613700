"""How the control plane classifies failures, each with a representative message:

- a query that validation refuses, or whose code raises while analysed: the swap is rejected;
- a new graph that does not start (or not within deploy_timeout), dies before the cut, or never gets
  a cut: the swap fails and the old query keeps serving;
- a graph query that dies: restarted from its checkpoint with doubling back-off, its budget given
  back after it stays healthy; once the budget is spent it failed for good (after a cut the swap is
  stranded and keeps the cut, with the way out named);
- Kafka errors: retriable ones are retried, the rest are not;
- errors that end the executor (lease, lost control state, the service graph failing for good)
  versus errors a tick retries.

The restart budget runs on the world's ManualClock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import fakeredis
import pytest
import redis
from kafka.errors import (
    KafkaConnectionError,
    KafkaError,
    LeaderNotAvailableError,
    NodeNotReadyError,
    NotControllerError,
    PolicyViolationError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)
from pyspark.sql.streaming.query import StreamingQuery

from hotswap.contract.errors import ControlStateLost, LeaseLost
from hotswap.contract.fence import Fence
from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.lifecycle import HEALTHY_RESET_S
from hotswap.contract.models import GraphState
from hotswap.contract.names import Keys
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.execution_graph.errors import GraphStartFailed
from hotswap.executor.control.controller import FATAL
from hotswap.executor.control.lease import Lease
from hotswap.executor.control.transient import TransientErrorsPersisted, is_transient, retry_transient
from hotswap.executor.errors import ExecutorError, LeaseHeld, SwapFailed
from hotswap.service_graph.errors import ServiceGraphError
from hotswap.service_graph.query import ServiceGraph
from tests.component.fakes import NO_SPARK, ManualClock, World, graph_record

pytestmark = pytest.mark.component

W = 60_000
SPARK_FAILURE = "[STREAM_FAILED] Query [id = 1f2e] terminated with exception: Job aborted due to stage failure"


def deployed(world: World, name: str = "b", window_ms: int = 30_000) -> str:
    swap_id = world.submit(name, window_ms)
    assert world.deploy(swap_id).state is SwapPhase.DEPLOYED
    return swap_id


def supervise_until_given_up(world: World, query_id: str) -> list[tuple[str, str]]:
    """Let `query_id` die after every restart until its budget is spent; returns what supervise reports."""
    runner = world.graphs.fake_runner
    for attempt in range(world.settings.query_restarts):
        runner.die(query_id, f"{SPARK_FAILURE} (attempt {attempt + 1})")
        assert world.graphs.supervise() == []  # first seen: the back-off starts
        world.clock.advance(world.settings.query_restart_backoff.s * 2**attempt)
        assert world.graphs.supervise() == []  # restarted from its checkpoint
        assert runner.restarted.count(query_id) == attempt + 1
    runner.die(query_id, f"{SPARK_FAILURE} (attempt {world.settings.query_restarts + 1})")
    return [(record.query_id, reason) for record, reason in world.graphs.supervise()]


# -- validation ------------------------------------------------------------------------------


def test_a_query_that_validation_refuses_is_rejected_with_its_one_line_reason(world: World) -> None:
    reason = "query 'b' output has no window_start column; select window.start AS window_start"
    world.graphs.refuse["b"] = reason
    swap_id = world.submit("b")
    world.protocol.step()
    record = world.journal.get(swap_id)
    assert (record.state, record.error, record.reason_code) == (SwapPhase.REJECTED, reason, ReasonCode.QUERY_INVALID)
    assert world.graphs.fake_runner.started == ["a"]
    assert world.graphs.get("b") is None


def test_an_error_raised_by_user_code_during_validation_rejects_the_swap_and_the_executor_carries_on(
    world: World,
) -> None:
    world.graphs.crash["b"] = ZeroDivisionError("division by zero\n  File 'b.py', line 3")
    swap_id = world.submit("b")
    world.protocol.step()  # does not raise
    record = world.journal.get(swap_id)
    assert record.state is SwapPhase.REJECTED
    assert record.error == "query 'b' could not be validated: ZeroDivisionError: division by zero"
    assert record.reason_code is ReasonCode.QUERY_RAISED


def test_window_sizes_without_a_near_common_boundary_are_rejected(world: World) -> None:
    swap_id = world.submit("b", 9_999)  # a runs 10 s windows: a common boundary only every 99,990 s
    world.protocol.step()
    record = world.journal.get(swap_id)
    assert record.state is SwapPhase.REJECTED
    assert "window sizes 10s and 9999ms share a boundary only every" in (record.error or "")
    assert record.reason_code is ReasonCode.WINDOWS_NOT_CUTTABLE


def test_a_swap_that_carries_no_query_is_rejected(world: World) -> None:
    world.journal.create(SwapRecord(id="empty", to_query="b"))
    world.protocol.step()
    record = world.journal.get("empty")
    assert (record.state, record.error) == (SwapPhase.REJECTED, "swap carries no query")
    assert record.reason_code is ReasonCode.NO_QUERY


# -- before the cut: the old query keeps serving -------------------------------------------------


def test_a_new_graph_that_does_not_start_fails_its_swap_and_the_old_query_keeps_serving(world: World) -> None:
    world.graphs.fake_runner.start_fails["b"] = "checkpoint belongs to another Spark query"
    swap_id = world.submit("b", 30_000)
    record = world.deploy(swap_id)
    assert record.state is SwapPhase.FAILED
    assert record.error == (
        "execution graph b failed to start: checkpoint belongs to another Spark query; the old query keeps serving"
    )
    assert record.reason_code is ReasonCode.DEPLOY_FAILED
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "a"
    assert world.graph_state("b") is GraphState.DISCARDED
    assert "b" not in world.graphs.fake_runner.queries


def test_a_deploy_whose_topic_kafka_refuses_fails_its_swap_once_and_the_loop_goes_on(world: World) -> None:
    refusal = ExecutorError("creating topic hotswap.t.graph.b failed at Kafka: TopicAuthorizationFailedError")
    world.graphs.fake_topics.refuse[world.settings.names.graph_topic("b")] = refusal
    swap_id = world.submit("b", 30_000)
    record = world.deploy(swap_id)
    assert record.state is SwapPhase.FAILED
    assert record.reason_code is ReasonCode.DEPLOY_FAILED
    assert record.error == f"{refusal}; the old query keeps serving"
    for _ in range(3):  # later ticks neither try again nor raise
        world.protocol.step()
    assert world.graphs.fake_topics.attempts.count(world.settings.names.graph_topic("b")) == 1
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "a"
    assert "b" not in world.graphs.fake_runner.started
    # The next swap deploys as usual.
    assert world.deploy(world.submit("c", 30_000)).state is SwapPhase.DEPLOYED


def test_a_new_query_that_dies_before_the_cut_fails_its_swap_and_the_old_query_keeps_serving(
    world: World,
) -> None:
    swap_id = deployed(world)
    world.graphs.fake_runner.die("b", SPARK_FAILURE)
    world.protocol.step()
    record = world.journal.get(swap_id)
    assert record.state is SwapPhase.FAILED
    assert record.error == f"new query b failed before the cut: {SPARK_FAILURE}; the old query keeps serving"
    assert record.reason_code is ReasonCode.QUERY_FAILED_BEFORE_CUT
    assert record.cut_window_end is None
    assert world.graph_state("a") is GraphState.RUNNING
    assert world.graph_state("b") is GraphState.DISCARDED
    assert world.graphs.fake_topics.deleted == [world.settings.names.graph_topic("b")]


def test_a_swap_that_gets_no_cut_within_the_cut_timeout_fails(world: World) -> None:
    swap_id = deployed(world)
    world.protocol.step()  # the first step that finds it deployed starts the wait
    world.clock.advance(world.settings.cut_timeout.s)
    world.protocol.step()
    assert world.state(swap_id) is SwapPhase.DEPLOYED  # exactly the timeout: still waiting
    world.clock.advance(1)
    world.protocol.step()
    record = world.journal.get(swap_id)
    assert record.state is SwapPhase.FAILED
    assert (record.error or "").startswith("no cut within 300s (cut_timeout): the service graph routed no batch")
    assert record.reason_code is ReasonCode.CUT_TIMEOUT
    assert world.graph_state("a") is GraphState.RUNNING


def test_a_deploy_is_checked_on_later_steps_and_never_waited_for(world: World) -> None:
    world.graphs.fake_runner.slow_start["b"] = 1_000  # it would take 1,000 checks to run
    swap_id = world.submit("b", 30_000)
    world.protocol.step()
    assert world.state(swap_id) is SwapPhase.DEPLOYING  # recorded before the query started
    assert world.graphs.fake_runner.started == ["a", "b"]
    assert world.graph_state("b") is GraphState.STARTING
    checks = len(world.graphs.fake_runner.ready_checks)
    for _ in range(3):
        world.protocol.step()
    assert len(world.graphs.fake_runner.ready_checks) == checks + 3  # one look per step, no waiting
    assert world.state(swap_id) is SwapPhase.DEPLOYING
    world.clock.advance(world.settings.deploy_timeout.s + 1)  # measured across the steps
    world.protocol.step()
    record = world.journal.get(swap_id)
    assert (record.state, record.reason_code) == (SwapPhase.FAILED, ReasonCode.DEPLOY_TIMEOUT)
    assert record.error == "execution graph b was not running after 120s (deploy_timeout); the old query keeps serving"
    assert "b" not in world.graphs.fake_runner.known()
    assert world.graph_state("b") is GraphState.DISCARDED


def test_a_graph_that_starts_late_is_recorded_running_with_deployed_in_one_write(world: World) -> None:
    world.graphs.fake_runner.slow_start["b"] = 2
    swap_id = world.submit("b", 30_000)
    world.protocol.step()
    world.protocol.step()
    world.protocol.step()
    assert (world.state(swap_id), world.graph_state("b")) == (SwapPhase.DEPLOYING, GraphState.STARTING)
    world.protocol.step()
    assert (world.state(swap_id), world.graph_state("b")) == (SwapPhase.DEPLOYED, GraphState.RUNNING)


# -- restarts and their budget ---------------------------------------------------------------


def test_a_graph_query_that_dies_is_restarted_after_a_back_off_that_doubles(world: World) -> None:
    runner = world.graphs.fake_runner
    runner.die("a", SPARK_FAILURE)
    world.graphs.supervise()  # first seen now
    world.clock.advance(1.9)
    world.graphs.supervise()
    assert runner.restarted == []
    world.clock.advance(0.1)
    world.graphs.supervise()
    assert runner.restarted == ["a"]  # after 2 s

    runner.die("a", SPARK_FAILURE)
    world.graphs.supervise()
    world.clock.advance(3.9)
    world.graphs.supervise()
    assert runner.restarted == ["a"]
    world.clock.advance(0.1)
    world.graphs.supervise()
    assert runner.restarted == ["a", "a"]  # then after 4 s
    assert world.graph_state("a") is GraphState.RUNNING


def test_a_graph_that_keeps_dying_is_given_up_with_its_last_failure_once_its_budget_is_spent(
    world: World,
) -> None:
    given_up = supervise_until_given_up(world, "a")
    assert given_up == [("a", f"{SPARK_FAILURE} (attempt 3)")]
    assert world.graphs.fake_runner.restarted == ["a", "a"]  # query_restarts = 2
    assert world.graph_state("a") is GraphState.FAILED
    world.clock.advance(3_600)
    assert world.graphs.supervise() == []  # no longer restarted (an executor restart tries again)


def test_a_query_that_stays_healthy_after_a_restart_gets_its_full_budget_back(world: World) -> None:
    runner = world.graphs.fake_runner
    runner.die("a", SPARK_FAILURE)
    world.graphs.supervise()
    world.clock.advance(2)
    world.graphs.supervise()
    assert runner.restarted == ["a"]
    world.clock.advance(HEALTHY_RESET_S + 1)
    world.graphs.supervise()  # healthy all along

    runner.die("a", SPARK_FAILURE)
    world.graphs.supervise()
    world.clock.advance(2)  # the first back-off again, not the doubled one
    world.graphs.supervise()
    assert runner.restarted == ["a", "a"]


def test_a_query_that_fails_again_soon_after_a_restart_keeps_its_doubled_back_off(world: World) -> None:
    runner = world.graphs.fake_runner
    runner.die("a", SPARK_FAILURE)
    world.graphs.supervise()
    world.clock.advance(2)
    world.graphs.supervise()
    world.clock.advance(HEALTHY_RESET_S / 2)
    world.graphs.supervise()

    runner.die("a", SPARK_FAILURE)
    world.graphs.supervise()
    world.clock.advance(2)
    world.graphs.supervise()
    assert runner.restarted == ["a"]  # 4 s now


# -- failed for good -------------------------------------------------------------------------


def test_a_new_query_that_fails_for_good_after_the_cut_strands_its_swap_and_keeps_the_cut(world: World) -> None:
    swap_id = deployed(world)
    world.cut(swap_id, W)
    world.watermark_passes_cut(swap_id)
    failed = [(world.graphs.get(q), reason) for q, reason in supervise_until_given_up(world, "b")]
    world.protocol.graphs_failed([(record, reason) for record, reason in failed if record is not None])

    record = world.journal.get(swap_id)
    assert record.state is SwapPhase.STRANDED
    assert record.reason_code is ReasonCode.QUERY_FAILED_AFTER_CUT
    assert record.cut_window_end == W  # routing keeps W: b's rows wait in its topic
    assert record.error == (
        f"query b kept failing after 2 restarts ({SPARK_FAILURE} (attempt 3)); its input waits in topic "
        f"{world.settings.names.graph_topic('b')}: `hotswap rollback {swap_id}` or "
        f"`hotswap submit FILE --fix {swap_id}` takes it over"
    )
    current = world.graphs.current()
    assert current is not None
    assert current.query_id == "b"  # it owns the windows after W, failed or not
    # The old graph still emits its windows through W, then is retired.
    assert world.graph_state("a") is GraphState.RUNNING
    world.emitted_through("a", W)
    world.protocol.step()
    assert world.graph_state("a") is GraphState.RETIRED


def test_a_serving_query_that_fails_for_good_outside_a_swap_holds_back_the_next_swap(world: World) -> None:
    failed = [(world.graphs.get(q), reason) for q, reason in supervise_until_given_up(world, "a")]
    world.protocol.graphs_failed([(record, reason) for record, reason in failed if record is not None])
    swap_id = world.submit("b", 30_000)
    world.protocol.step()
    assert world.state(swap_id) is SwapPhase.VALIDATED  # waits, rather than cutting away from a dead query
    assert world.graphs.fake_runner.started == ["a"]


class DeadQuery:
    """A StreamingQuery that terminated with `failure`."""

    def __init__(self, failure: Exception) -> None:
        self.isActive = False
        self._failure = failure

    def exception(self) -> Exception:
        return self._failure


def test_a_service_graph_that_fails_past_its_budget_ends_the_executor_with_one_line() -> None:
    settings = Settings(namespace="component", query_restarts=0)
    service = ServiceGraph(
        NO_SPARK,
        fakeredis.FakeRedis(),
        pipeline=settings.pipeline,
        kafka=settings.kafka,
        timeouts=settings.timeouts,
        recovery=settings.recovery,
    )
    service.query = cast(StreamingQuery, DeadQuery(RuntimeError("Kafka source lost offsets\n\tat org.apache...")))
    with pytest.raises(ServiceGraphError) as ended:
        service.supervise()
    message = str(ended.value)
    assert message.startswith("the service graph failed 1 times (Kafka source lost offsets); fix the cause")
    assert "\n" not in message
    assert isinstance(ended.value, FATAL)


# -- Kafka errors and the executor loop -----------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (NodeNotReadyError("broker 1 restarting"), True),
        (LeaderNotAvailableError("partition 0 has no leader yet"), True),
        (NotControllerError("controller moved"), True),
        (RequestTimedOutError("request timed out after 30000 ms"), True),
        (KafkaConnectionError("connection refused"), True),
        (TopicAuthorizationFailedError("not authorized to create topic"), False),
        (PolicyViolationError("replication factor below the minimum"), False),
        (KafkaError("generic failure"), False),
        (redis.ConnectionError("Redis is restarting"), False),
        (ValueError("bad input"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_only_retriable_kafka_errors_are_retried_as_transient(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def raised(action: Callable[[], object]) -> Exception:
    """The exception `action` raises, which it must."""
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - whatever it is, the caller classifies it
        return exc
    raise AssertionError("expected an exception")


def test_losing_the_lease_or_the_control_state_ends_the_executor() -> None:
    client = fakeredis.FakeRedis()
    keys = Keys("component")
    client.set(keys.lease, "elsewhere:1:a:space", px=15_000)
    clock = ManualClock()
    held = raised(lambda: Lease(client, keys.lease, clock=clock, sleep=clock.sleep).acquire(0))
    client.set(keys.namespace_record, "{}")
    lost = raised(lambda: Fence(keys, "this:2:b:space").verify(client))  # another executor took over
    client.delete(keys.namespace_record)
    vanished = raised(lambda: Fence(keys, "elsewhere:1:a:space").verify(client))  # Redis was flushed
    assert [type(e) for e in (held, lost, vanished)] == [LeaseHeld, LeaseLost, ControlStateLost]
    assert all(isinstance(e, FATAL) for e in (held, lost, vanished))


def test_transient_failures_in_a_tick_are_retried_by_the_executor_loop(world: World) -> None:
    clock = ManualClock()

    def broker_down() -> None:
        raise NodeNotReadyError("broker 1 restarting")

    gave_up = raised(lambda: retry_transient(broker_down, "creating topic t", 10, clock=clock, sleep=clock.sleep))
    assert isinstance(gave_up, TransientErrorsPersisted)
    world.graphs.fake_runner.start_fails["b"] = "Kafka source not ready"
    record = graph_record("b", 10_000, "t.b")
    not_started = raised(lambda: world.graphs.deploy_first(record))
    assert isinstance(not_started, GraphStartFailed)
    redis_down = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    for error in (gave_up, not_started, redis_down):
        assert not isinstance(error, FATAL), error


def test_the_cli_s_exit_message_carries_the_reason_code(world: World) -> None:
    world.graphs.fake_runner.start_fails["b"] = "checkpoint belongs to another Spark query"
    swap_id = world.submit("b", 30_000)
    world.deploy(swap_id)
    with pytest.raises(SwapFailed) as failed:
        world.operator().wait_until_done(swap_id, 1)
    assert failed.value.reason_code is ReasonCode.DEPLOY_FAILED
    assert str(failed.value).startswith(f"swap {swap_id} failed (deploy_failed): execution graph b failed to start")


CONFLICT = (
    "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs detected for 39. "
    "Please make sure only one streaming job accesses a specific checkpoint location at a time."
)


def test_a_checkpoint_still_written_by_a_stalled_executor_is_retried_without_using_up_restarts(world: World) -> None:
    runner = world.graphs.fake_runner
    for _ in range(world.settings.query_restarts + 3):  # more conflicts than restarts allowed
        runner.die("a", CONFLICT)
        assert world.graphs.supervise() == []
        world.clock.advance(world.settings.query_restart_backoff.s)  # one back-off: not doubled
        assert world.graphs.supervise() == []
    assert runner.restarted.count("a") == world.settings.query_restarts + 3
    assert world.graph_state("a") is not GraphState.FAILED


def test_checkpoint_conflicts_past_the_retry_deadline_count_as_failures(world: World) -> None:
    runner = world.graphs.fake_runner
    runner.die("a", CONFLICT)
    world.graphs.supervise()
    world.clock.advance(world.settings.retry_deadline.s + 1)
    given_up = []
    for attempt in range(world.settings.query_restarts + 1):
        world.graphs.supervise()  # restarted (the back-off has passed), counted now
        runner.die("a", CONFLICT)
        given_up = world.graphs.supervise()
        world.clock.advance(world.settings.query_restart_backoff.s * 2 ** (attempt + 1))
    assert [(record.query_id, reason) for record, reason in given_up] == [("a", CONFLICT)]
    assert world.graph_state("a") is GraphState.FAILED
