"""The executor: hosts the Spark driver, deploys the service graph and the execution graphs,
drives swaps, and resumes from Redis and the checkpoints after a restart."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

import redis
import structlog
from pyspark.sql import SparkSession

from hotswap.contract.causes import first_line
from hotswap.contract.errors import ConfigError, ControlStateLost, HotswapError, LeaseLost
from hotswap.contract.fence import Fence, fenced_write
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import (
    EXECUTOR_TRANSITIONS,
    ExecutorPhase,
    ExecutorRecord,
    GraphRecord,
    GraphState,
    NamespaceRecord,
    QuerySource,
)
from hotswap.contract.names import Keys
from hotswap.contract.outages import KAFKA, OUTAGES, REDIS
from hotswap.contract.ownership import read_owned_windows
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.contract.source import SourceSpec
from hotswap.execution_graph.checkpoint import root_files
from hotswap.execution_graph.errors import QueryRejected, SchemaRefused
from hotswap.execution_graph.graph import GraphQuery
from hotswap.execution_graph.schemas import resolve
from hotswap.executor.control.admission import Analyser, basis_for, not_validated_in_time, on_own_thread
from hotswap.executor.control.dry_run import DryRuns
from hotswap.executor.control.durability import check_durability
from hotswap.executor.control.graphs import Graphs
from hotswap.executor.control.lease import Lease
from hotswap.executor.control.namespace import JournalSeen, claim
from hotswap.executor.control.requests import OperatorRequests
from hotswap.executor.control.retention import Retention
from hotswap.executor.control.swap import SwapProtocol
from hotswap.executor.control.topics import Topics
from hotswap.executor.control.transient import TransientErrorsPersisted
from hotswap.executor.errors import ExecutorError, LeaseHeld
from hotswap.service_graph.errors import ServiceGraphError
from hotswap.service_graph.query import ServiceGraph
from hotswap.service_sink.progress import ProgressReporter

log = structlog.get_logger(__name__)

TICK_S = 0.25
DRAIN_TICK_S = 0.05  # while a swap waits for its old graph's last windows (SwapProtocol.awaiting_output)
OUTAGE_S = 300.0  # how long the loop keeps retrying a failing tick before the executor gives up
# Not retried: another executor holds (or took over) the lease, the namespace's control state vanished,
# or the service graph failed for good.
FATAL = (LeaseHeld, LeaseLost, ControlStateLost, ServiceGraphError)


class Executor:
    def __init__(self, settings: Settings, spark: SparkSession, client: redis.Redis) -> None:
        self.settings = settings
        self._spark = spark
        self._redis = client
        self._keys = Keys(settings.namespace)
        self._topics = Topics(settings.kafka, settings.pipeline, settings.timeouts)
        self._lease = Lease(client, self._keys.lease, settings.lease_ttl.ms)
        self.lease = self._lease  # read by the metrics (renewals and failures)
        # Every control write below checks that this executor still holds the lease (contract.fence).
        self._fence = Fence(self._keys, self._lease.token)
        self.graphs = Graphs(
            spark,
            client,
            self._topics,
            self._fence,
            pipeline=settings.pipeline,
            kafka=settings.kafka,
            queries=settings.queries,
            timeouts=settings.timeouts,
            recovery=settings.recovery,
        )
        self.service = ServiceGraph(
            spark,
            client,
            self._fence,
            pipeline=settings.pipeline,
            kafka=settings.kafka,
            timeouts=settings.timeouts,
            recovery=settings.recovery,
            on_markers=self.graphs.runner.markers_taken,
        )
        self.reporter = ProgressReporter(
            client,
            self._keys,
            self.graphs.runner.is_committed,
            self._fence,
            checkpoint_watermark=self.graphs.runner.last_commit_watermark,
            batch_watermark=self.graphs.runner.batch_watermark,
        )
        self._swaps: SwapProtocol | None = None
        self._analyser = Analyser(settings.pipeline, self.graphs)  # admits the namespace's first query
        self.dry_runs = DryRuns(  # `submit --dry-run`: answered, never recorded
            spark, client, self.graphs, pipeline=settings.pipeline, kafka=settings.kafka, timeouts=settings.timeouts
        )
        self.requests = OperatorRequests(client, self._keys, self._fence)  # submit, abort, promote
        self._phase = ExecutorPhase.STOPPED
        self.ready = threading.Event()
        journal = Journal(client, self._keys, self._fence)
        self._retention = Retention(
            settings.pipeline, journal, self.graphs, Topics(settings.kafka, settings.pipeline, settings.timeouts)
        )
        # The namespace's own files at its checkpoints' root: the journal's version seen.
        self._checkpoints = root_files(settings.names.checkpoint_root, spark)
        self._journal_seen = JournalSeen(self._checkpoints)

    def spark_queries(self) -> list[GraphQuery]:
        """The service graph's and the execution graphs' Spark queries, live or dead."""
        service = [self.service.query] if self.service.query is not None else []
        return service + list(self.graphs.runner.running().values())

    def run(self, initial: QuerySource | None, stop: threading.Event) -> None:
        """Run until `stop` is set; returns after stopping every query this executor started."""
        check_durability(self._redis, self.settings.control)
        source = self._resolved_source()
        self._lease.acquire(self.settings.lease_wait.s)
        try:
            claim(self._redis, self.settings.control, self._topics, self._checkpoints, self._lease.token, source)
        except Exception:
            self._lease.release()
            raise
        self._enter(ExecutorPhase.BOOTSTRAPPING)
        structlog.contextvars.bind_contextvars(namespace=self.settings.namespace)
        try:
            self._bootstrap(initial, source)
            self._swaps = SwapProtocol(
                self._redis,
                self.graphs,
                self.reporter,
                self._fence,
                pipeline=self.settings.pipeline,
                timeouts=self.settings.timeouts,
                recovery=self.settings.recovery,
            )
            self._enter(ExecutorPhase.RUNNING)
            self.ready.set()
            log.info("executor running", source=self.settings.source_topic, sink=str(self.settings.sink_spec))
            failing_since: float | None = None
            committed = self.graphs.runner.batch_committed
            while not stop.is_set():
                committed.clear()  # before the tick: a commit during it wakes the next wait at once
                try:
                    self.tick()
                    failing_since = None
                    OUTAGES.up(REDIS)  # a tick reads and writes Redis
                except FATAL:
                    raise
                except Exception as exc:
                    # One failed tick must not end the executor: Redis and Kafka clients retry on
                    # their own, and here the loop keeps ticking a while longer.
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > OUTAGE_S:
                        raise ExecutorError(
                            f"the executor loop kept failing for {OUTAGE_S:.0f}s ({type(exc).__name__}: "
                            f"{first_line(exc)}); fix the cause, then restart `hotswap run`"
                        ) from exc
                    error = f"{type(exc).__name__}: {first_line(exc)}"
                    retrying = f"the executor's loop, for up to {OUTAGE_S:.0f}s"
                    if isinstance(exc, redis.RedisError):
                        OUTAGES.down(REDIS, error, retrying)
                    elif isinstance(exc, TransientErrorsPersisted):
                        OUTAGES.down(KAFKA, error, retrying)
                    else:
                        log.warning("executor tick failed; retrying", error=error)
                if self._swaps.awaiting_output:
                    committed.wait(DRAIN_TICK_S)  # a closing graph's commit ends the wait
                else:
                    stop.wait(TICK_S)
        finally:
            self._shutdown()

    def tick(self) -> None:
        self._lease.check()
        self._fence.verify(self._redis)
        assert self._swaps is not None
        # Progress first: a drain the old graph finished since the last tick is seen by this step.
        self.reporter.report(self.graphs.runner.running())
        self.requests.apply_pending()  # before the step: a swap submitted now is validated in this tick
        self._swaps.step()
        failed = self.graphs.supervise()
        if failed:
            self._swaps.graphs_failed(failed)
        self.service.supervise()
        self.service.tick()
        self.dry_runs.answer_pending()
        self._retention.sweep_due()
        self._journal_seen.note(int(self._redis.get(self._keys.journal_version) or 0))

    def _bootstrap(self, initial: QuerySource | None, source: SourceSpec) -> None:
        settings = self.settings
        self._check_source(source)
        partitions = self._topics.partitions(settings.source_topic)
        if partitions is None:
            self._topics.ensure(settings.source_topic, settings.source_partitions)
            partitions = settings.source_partitions
        self.graphs.source_partitions = partitions
        if settings.pipeline.sink.is_kafka:
            compacted = {"cleanup.policy": "compact"} if settings.sink_compacted else None
            self._topics.ensure(settings.sink_topic, partitions, compacted)
        for topic in (settings.names.late_topic, settings.names.dead_letter_topic):
            self._topics.ensure(topic, partitions)

        journal = Journal(self._redis, self._keys, self._fence)
        current = self.graphs.current()
        records = self.graphs.records()
        if current is None:
            if initial is None:
                raise ExecutorError(
                    f"namespace {settings.namespace!r} has no query yet; start it with `hotswap run --query FILE`"
                )
            # A first deploy that an earlier executor began (recorded, not yet current) is resumed.
            begun = next((r for r in records.values() if r.state is GraphState.STARTING), None)
            self._deploy_initial(begun.source if begun else initial, begun)
        else:
            if initial is not None:
                log.info(
                    "namespace already has a query; resuming it (submit a new one with `hotswap submit`)",
                    query_id=current.query_id,
                )
            self._resume(current.query_id, journal.open(), records)
        self.service.start(source)

    def _resolved_source(self) -> SourceSpec:
        """The namespace's source as its settings declare it, resolved against Spark."""
        try:
            return resolve(self._spark, self.settings.source_spec())
        except SchemaRefused as exc:
            raise ConfigError(f"the source cannot be read as declared: {exc}") from exc

    def _check_source(self, source: SourceSpec) -> None:
        """Refuse a source other than the one the namespace recorded when it was first claimed: how
        the service graph finds a record's event time must never change under a namespace that has
        routed rows (a replayed batch would route differently)."""
        raw = self._redis.get(self._keys.namespace_record)
        if raw is None:
            raise self._fence.control_state_lost()
        recorded = NamespaceRecord.model_validate_json(raw).source
        if recorded.reading_identity() != source.reading_identity():
            raise ConfigError(
                f"namespace {self.settings.namespace!r} reads its source as ({recorded.describe()}), "
                f"not as ({source.describe()}); a namespace keeps how it reads event time for its life: run "
                "with the flags it was started with, or start a new namespace (--namespace)"
            )
        self.graphs.namespace_source = source
        log.info("source", topic=self.settings.source_topic, reads=source.describe())

    def _resume(self, current: str, swaps: list[SwapRecord], records: dict[str, GraphRecord]) -> None:
        """Start again the graphs that serve: the current one, and each open swap's graphs, except
        those the swap is about to stop or that only a rollback or fix may end. A graph a swap is
        deploying is started by that swap's step; graphs no open swap names are removed."""
        needed = {current} | {s.to_query for s in swaps} | {s.from_query for s in swaps if s.from_query}
        # The old graph of a swap that is retiring or retired: stopped, or about to be.
        left = {s.from_query for s in swaps if s.state in (SwapPhase.RETIRING, SwapPhase.RETIRED)}
        # A stranded swap's query failed for good: only a rollback or a fix forward takes it over.
        left |= {s.to_query for s in swaps if s.state.is_stranded}
        resumed: list[GraphRecord] = []
        for record in records.values():
            if record.query_id not in needed:
                # Neither current nor named by an open swap: a swap that ended before its cut left it (an
                # executor stopped before it was discarded). A failed graph that owns windows served, and
                # keeps them until a rollback, a fix or a replace takes it over.
                never_served = (
                    record.state is not GraphState.FAILED
                    or not read_owned_windows(self._redis, self._keys, record).ranges
                )
                if not record.state.is_ended and never_served:
                    log.info("removing graph that no open swap needs", query_id=record.query_id)
                    self.graphs.discard(record.query_id)
                continue
            # A failed graph still owns its windows: it is tried again (a starting one is its swap's to start).
            if record.state in (GraphState.RUNNING, GraphState.FAILED) and record.query_id not in left:
                resumed.append(record)
        self.graphs.resume(resumed)

    def _deploy_initial(self, initial: QuerySource, begun: GraphRecord | None) -> None:
        """The namespace's first query (or the one an earlier executor began to deploy), admitted as
        any submit is, against no query: a query that is refused ends `hotswap run` with its reason."""
        basis = basis_for((), None, self.graphs.get, self.graphs.namespace_source)
        # On a thread of its own, as a submit's: the user's code may not end, and what it raises is
        # refused in one line, never a traceback.
        analysis = on_own_thread(lambda: self._analyser.analyse(initial, basis), "hotswap-first-query")
        timeout = self.settings.validation_timeout
        try:
            analysed = analysis.result(timeout=timeout.s)
        except FutureTimeout:
            raise QueryRejected(not_validated_in_time(initial, timeout), ReasonCode.VALIDATION_TIMEOUT) from None
        rejected = analysed.rejection
        if rejected is not None:
            reason, code = rejected
            raise QueryRejected(reason, code) from analysed.error
        shape = analysed.shape
        assert shape is not None
        if shape.window_ms != self.settings.window.ms:
            log.info(
                "query window differs from the service window; routing uses the service window",
                query_window_ms=shape.window_ms,
                service_window_ms=self.settings.window.ms,
            )
        query_id = begun.query_id if begun else self.graphs.unique_id(initial.name, set())
        record = begun or self._analyser.graph_record(analysed, query_id)
        self.graphs.deploy_first(record)
        log.info("initial execution graph running", query_id=query_id, windows=shape.windowing.describe())

    def _stopped(self) -> None:
        try:
            self._enter(ExecutorPhase.STOPPED)
        finally:
            self._lease.release()

    def _enter(self, phase: ExecutorPhase) -> None:
        if phase not in EXECUTOR_TRANSITIONS[self._phase]:
            raise ExecutorError(f"executor cannot go from {self._phase} to {phase}")
        record = ExecutorRecord(holder=self._lease.token, phase=phase)
        fenced_write(self._redis, self._fence, lambda pipe: pipe.set(self._keys.executor, record.model_dump_json()))
        self._phase = phase

    def _shutdown(self) -> None:
        log.info("executor stopping")
        # After a lost lease or lost control state, these records are not ours to write.
        with contextlib.suppress(redis.RedisError, HotswapError):
            self._enter(ExecutorPhase.STOPPING)
        if self._swaps is not None:
            self._swaps.close()  # a validation in progress is abandoned, after a short bound at most
        closing = (self._topics.close, self._retention.close)
        stopping = (self.service.stop, self.graphs.runner.stop_all, self.graphs.close_tables)
        for action in (*stopping, *closing, self._stopped):
            try:
                action()
            except (HotswapError, redis.RedisError, OSError) as exc:
                log.warning("error while stopping", action=getattr(action, "__name__", "?"), error=str(exc))
        structlog.contextvars.unbind_contextvars("namespace")
