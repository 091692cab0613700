"""The execution graphs of one namespace: their records in Redis and their Spark queries.

A graph's record is written before the action it describes (starting, retiring), mostly by the
swap journal in the same write as the swap's phase, so a restarted executor can finish what was
begun.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import redis
import structlog
from kafka.errors import KafkaError
from pyspark.sql import SparkSession

from hotswap.contract.causes import is_checkpoint_conflict, is_sink_outage
from hotswap.contract.envelope import DeadLetterReason
from hotswap.contract.errors import HotswapError, TimeoutExpired
from hotswap.contract.fence import Batch, Fence, fenced_write
from hotswap.contract.lifecycle import RestartBudget
from hotswap.contract.models import CurrentQuery, GraphEngine, GraphRecord, GraphState, QuerySource, now_ms
from hotswap.contract.names import DEAD_LETTER, DEAD_LETTER_RECORDS, ROUTED, SKIPPED, STALLED, Keys
from hotswap.contract.ownership import OwnershipReader
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.records import read_current, read_graphs, read_graphs_named
from hotswap.contract.rewrites import read_rewrites
from hotswap.contract.settings import KafkaSettings, PipelineSettings, QueryRules, RecoverySettings, Timeouts
from hotswap.contract.sink import SinkKind
from hotswap.contract.source import SourceFormat, SourceSpec
from hotswap.execution_graph.confinement import check_kind, check_size, isolated_session
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.events import batch_events
from hotswap.execution_graph.graph import GraphRunner, events_stream
from hotswap.execution_graph.poison import dead_letter_rows
from hotswap.execution_graph.schemas import check_version
from hotswap.execution_graph.validation import QueryShape, validate_query
from hotswap.executor.control.topics import Topics
from hotswap.executor.errors import ExecutorError
from hotswap.service_sink.delta import DeltaTable
from hotswap.service_sink.postgres import PostgresTable
from hotswap.service_sink.results import ResultTable, ResultWriter

log = structlog.get_logger(__name__)

STOP_WAIT_S = 2.0  # how long one step waits for a retiring graph's query to stop (retire_timeout bounds the whole)


class Graphs:
    def __init__(
        self,
        spark: SparkSession,
        client: redis.Redis,
        topics: Topics,
        fence: Fence | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        pipeline: PipelineSettings,
        kafka: KafkaSettings,
        queries: QueryRules,
        timeouts: Timeouts,
        recovery: RecoverySettings,
    ) -> None:
        self._fence = fence
        self._clock = clock  # measures restart back-off and healthy time (tests move it by hand)
        self._spark = spark
        self._pipeline = pipeline
        self._kafka = kafka
        self._queries = queries
        self._timeouts = timeouts
        self._recovery = recovery
        self._redis = client
        self._keys = Keys(pipeline.names.namespace)
        self._topics = topics
        self.runner = GraphRunner(
            spark, pipeline, kafka, queries, timeouts, rewrites=lambda: read_rewrites(client, self._keys).values()
        )
        self._restarts: dict[str, RestartBudget] = {}
        self._namespace_source: SourceSpec | None = None  # set when the executor starts (namespace_source)
        # The source topic's partitions when the executor started: a closing graph's topic has as
        # many unless `graph_partitions` says otherwise.
        self.source_partitions: int = pipeline.source_partitions
        # Queries under an automatic rollback's error budget: (failures allowed, within seconds).
        # The last stall of each graph whose batch was cancelled for running too long.
        self.stalls: dict[str, str] = {}
        self._stopping: dict[str, threading.Thread] = {}  # retiring graphs whose query is being stopped
        self._tables: dict[str, ResultTable] = {}  # each graph's sink table, kept across its restarts
        self.stop_wait_s = STOP_WAIT_S
        self._error_budgets: dict[str, tuple[int, float]] = {}

    @property
    def namespace_source(self) -> SourceSpec:
        """The namespace's resolved source, set when the executor starts: what a query reads unless
        it or its predecessor declares its own schema."""
        if self._namespace_source is None:
            raise ExecutorError(
                "the namespace's source was not read before a query needed it; this is a bug in hotswap"
            )
        return self._namespace_source

    @namespace_source.setter
    def namespace_source(self, source: SourceSpec) -> None:
        self._namespace_source = source

    # -- records ---------------------------------------------------------------------------
    def records(self) -> dict[str, GraphRecord]:
        """Every graph ever recorded (for bootstrap and clean-up; the loop reads graphs by id)."""
        return read_graphs(self._redis, self._keys)

    def get(self, query_id: str) -> GraphRecord | None:
        raw = self._redis.hget(self._keys.graphs, query_id)
        return None if raw is None else GraphRecord.model_validate_json(raw)

    def get_many(self, query_ids: Iterable[str]) -> dict[str, GraphRecord]:
        return read_graphs_named(self._redis, self._keys, query_ids)

    def save(self, record: GraphRecord) -> None:
        fenced_write(
            self._redis,
            self._fence,
            lambda batch: batch.hset(self._keys.graphs, record.query_id, record.model_dump_json()),
        )

    def current(self) -> CurrentQuery | None:
        return read_current(self._redis, self._keys)

    def unique_id(self, name: str, taken: set[str]) -> str:
        def used(query_id: str) -> bool:
            base, number = numbered(query_id)
            forgotten = self._redis.hget(self._keys.forgotten_names, base)  # ids up to base-N were given
            if forgotten is not None and number <= int(forgotten):
                return True
            return query_id in taken or bool(self._redis.hexists(self._keys.graphs, query_id))

        if not used(name):
            return name
        n = 2
        while used(f"{name}-{n}"):
            n += 1
        return f"{name}-{n}"

    # -- validation ------------------------------------------------------------------------
    def layout(self) -> tuple[GraphEngine, int]:
        """The engine and topic partitions of a graph recorded now (GraphRecord's fields)."""
        engine = self._pipeline.graph_engine
        if engine is GraphEngine.STATEFUL:
            return engine, 1
        return engine, self._pipeline.graph_partitions or self.source_partitions

    def validate(self, source: QuerySource, running_window_ms: int | None, reads: SourceSpec) -> QueryShape:
        """Analyse the query over the `events` its version would read (`reads`), as the engine of a
        graph deployed now would run it: over a stream of a topic that is never started (stateful),
        or over an empty batch (closing), so nothing is read. `running_window_ms`: the spacing of
        the running query's window ends (its slide; its size when tumbling)."""
        pipeline, queries = self._pipeline, self._queries
        check_size(source)
        check_kind(source, queries.query_kinds)
        # A session of its own: whatever the text is, it never touches the executor's session.
        session = isolated_session(self._spark, queries.static_tables)
        tables = tuple(queries.static_tables)
        if pipeline.graph_engine is GraphEngine.CLOSING:
            return validate_query(session, source, batch_events(session, reads), running_window_ms, tables)
        stream = events_stream(session, pipeline, self._kafka, pipeline.names.graph_topic("validation"), reads)
        return validate_query(session, source, stream, running_window_ms, tables)

    def version_reads(self, source: QuerySource, predecessor: SourceSpec) -> SourceSpec:
        """How a submitted query version reads the source: with the schema it declares (checked
        against the one it replaces), else with its predecessor's. Raises QueryRejected."""
        if source.source_schema is None and source.avro_schema is None:
            return predecessor
        if predecessor.format is SourceFormat.AVRO and source.source_schema is not None:
            raise QueryRejected(
                f"query {source.name!r} declares a DDL schema, but the namespace reads Avro: give an .avsc with "
                "--avro-schema instead"
            )
        if predecessor.format is SourceFormat.JSON and source.avro_schema is not None:
            raise QueryRejected(
                f"query {source.name!r} declares an Avro schema, but the namespace reads JSON: give a DDL with "
                "--source-schema instead"
            )
        wanted = predecessor.for_version(schema_ddl=source.source_schema, avro_reader_schema=source.avro_schema)
        return check_version(self._spark, predecessor, wanted)

    # -- lifecycle -------------------------------------------------------------------------
    def begin(self, record: GraphRecord) -> None:
        """Create the graph's topic and start its query without waiting for it (see `ready`). The
        caller recorded the graph (and its swap `deploying`) first.

        The topic has the record's partitions. Within each, rows and the watermark markers after them
        stay in the order the service graph wrote them, so the graph never reads a marker before rows
        it covers (a stateful graph's topic has one: Spark's watermark is the largest over partitions).
        """
        self._ensure_topics(record)
        self.runner.begin(record, self._writer(record))

    def _ensure_topics(self, record: GraphRecord) -> None:
        self._topics.ensure(record.topic, record.partitions)
        if record.shadow_results_topic is not None:
            self._topics.ensure(record.shadow_results_topic, 1)

    def ready(self, query_id: str) -> bool:
        """Whether the graph's query runs yet; raises GraphStartFailed if it will not."""
        return self.runner.ready(query_id)

    def deploy_first(self, record: GraphRecord, clock: Callable[[], float] = time.monotonic) -> GraphRecord:
        """The namespace's first graph, deployed while the executor boots: recorded, started, and
        waited for until it runs; then recorded running and current, in one write.

        This one deploy blocks, before the executor's loop starts: there is nothing to serve yet and
        the service graph cannot route without a current graph, and a first query that cannot start
        should end `hotswap run` with its reason rather than leave an executor that serves nothing.
        """
        self.save(record)
        self.begin(record)
        deadline = clock() + self._timeouts.deploy_timeout.s
        while not self.ready(record.query_id):
            if clock() >= deadline:
                raise TimeoutExpired(
                    f"execution graph {record.query_id} was not running after {self._timeouts.deploy_timeout} "
                    "(deploy_timeout)"
                )
            time.sleep(0.2)
        running = record.moved(GraphState.RUNNING)
        current = CurrentQuery(query_id=running.query_id, started_at=running.started_at or now_ms())

        def queue(batch: Batch) -> None:
            batch.hset(self._keys.graphs, running.query_id, running.model_dump_json())
            batch.set(self._keys.current, current.model_dump_json())

        fenced_write(self._redis, self._fence, queue)
        return running

    def resume(self, records: list[GraphRecord]) -> None:
        """Start again, from their checkpoints, the graphs that ran when the executor stopped (their
        readiness is not waited for: a query that dies is restarted by `supervise`).

        They start side by side: each start reads its checkpoint and plans the user's query, 2.5 to
        3.6 s for a closing graph in a freshly started executor, and the executor serves once all have
        started. What a start raises is raised here once every start has ended, as before.
        """
        started: list[tuple[GraphRecord, ResultWriter]] = []
        for record in records:
            log.info("resuming execution graph", query_id=record.query_id, state=record.state)
            if record.state is GraphState.FAILED:
                # An executor restart is the retry its failure asked for: it serves again (and is marked
                # failed again if it fails for good again), so swaps no longer wait on it.
                record = record.moved(GraphState.RUNNING)
                self.save(record)
            self._ensure_topics(record)
            started.append((record, self._writer(record)))
        with ThreadPoolExecutor(max(len(started), 1), thread_name_prefix="hotswap-resume") as pool:
            starts = [
                pool.submit(contextvars.copy_context().run, self.runner.start, record, writer)
                for record, writer in started
            ]
        for start in starts:  # every start has ended: the pool waited for them
            failure = start.exception()
            if failure is not None:
                raise failure

    def supervise(self) -> list[tuple[GraphRecord, str]]:
        """Restart dead graph queries from their checkpoints, with doubling back-off.

        Returns the graphs that failed for good, with the last failure: their restarts are spent, or
        they failed more often than an automatic rollback's error budget allows. They are marked
        failed and no longer restarted (an executor restart tries them again).
        """
        failed: list[tuple[GraphRecord, str]] = []
        now = self._clock()
        for query_id in self.runner.query_ids():
            stall = self.runner.watch(query_id, now)
            if stall is not None:
                self._stalled(query_id, stall)
            failure = self.runner.failure(query_id)
            restarts = self._restarts.setdefault(
                query_id, RestartBudget(self._recovery.query_restarts, self._recovery.query_restart_backoff.s)
            )
            if failure is None:
                restarts.healthy(now)
                continue
            record = self.get(query_id)
            if record is None:
                continue
            if record.state.is_ended:  # retired or discarded: its query must not run, let alone restart
                self.runner.stop(query_id)
                self._close_table(query_id)
                continue
            outage = is_sink_outage(failure)
            if (is_checkpoint_conflict(failure) or outage) and restarts.forgives_conflict(
                now, self._timeouts.retry_deadline.s
            ):
                # A stalled predecessor's Spark still writes this checkpoint, or the sink's database is
                # away: retry, uncounted, until its queries stop (it exits once it wakes without its
                # lease) or the sink is back, or retry_deadline passes.
                if restarts.first_seen(now):
                    log.warning(
                        "execution graph's sink cannot be written; retrying its batch"
                        if outage
                        else "execution graph's checkpoint is still written by another executor's Spark; retrying",
                        query_id=query_id,
                        error=failure,
                    )
                if restarts.retry_due(now):
                    self.runner.restart(record, self._writer(record))
                continue
            new_failure = restarts.first_seen(now)
            # A sink that stays away is no fault of the query: it neither spends an automatic
            # rollback's error budget nor makes its batch a poison batch.
            over_budget = self._over_error_budget(query_id, restarts, now) if new_failure and not outage else None
            if restarts.exhausted and not over_budget and not outage and self._skip_poison_batch(record, failure):
                self._restarts[query_id] = RestartBudget(
                    self._recovery.query_restarts, self._recovery.query_restart_backoff.s
                )
                continue
            if restarts.exhausted or over_budget:
                why = f"{failure}; {over_budget}" if over_budget else failure
                log.error("execution graph failed for good", query_id=query_id, attempts=restarts.attempts, error=why)
                self.runner.stop(query_id)
                self._close_table(query_id)
                if record.state is not GraphState.FAILED:  # else resumed after it failed, and failed again
                    self.save(record.moved(GraphState.FAILED))
                failed.append((record, why))
                continue
            if new_failure:
                log.warning("execution graph failed; restarting from its checkpoint", query_id=query_id, error=failure)
            if restarts.restart_due(now):
                self.runner.restart(record, self._writer(record))
        return failed

    def _skip_poison_batch(self, record: GraphRecord, failure: str) -> bool:
        """With `poison_batches = dead_letter`, the serving query that failed for good on a batch
        moves that batch's rows to the dead-letter topic and goes on without them (True). Only once
        per batch: failing again without those rows, it was not the rows."""
        if self._recovery.poison_batches != "dead_letter":
            return False
        current = self.current()
        if current is None or current.query_id != record.query_id:
            return False  # a new version is rolled back or fixed instead: nothing of it is lost
        rows = self.runner.failing_rows(record)
        if not rows or any(s.batch_id == rows[0].batch_id for s in record.skipped):
            return False
        why = f"the serving query {record.query_id} failed for good on its batch {rows[0].batch_id}: {failure}"
        try:
            moved = dead_letter_rows(
                self._kafka,
                self._pipeline.names.dead_letter_topic,
                record,
                rows,
                why,
                self._timeouts.retry_deadline.s,
            )
        except (KafkaError, HotswapError) as exc:
            log.error("poison batch not moved to the dead-letter topic", query_id=record.query_id, error=str(exc))
            return False
        skipping = record.changed(skipped=(*record.skipped, *rows))

        def queue(batch: Batch) -> None:
            batch.hset(self._keys.graphs, skipping.query_id, skipping.model_dump_json())
            batch.hincrby(self._keys.counters, f"{SKIPPED}{record.query_id}", 1)
            batch.hincrby(self._keys.counters, DEAD_LETTER_RECORDS, moved)
            batch.hincrby(self._keys.counters, f"{DEAD_LETTER}{DeadLetterReason.POISON_BATCH}", moved)

        fenced_write(self._redis, self._fence, queue)
        log.warning(
            "serving query failed for good on a batch; its rows went to the dead-letter topic and it goes on",
            query_id=record.query_id,
            batch=rows[0].batch_id,
            rows=moved,
            error=failure,
            reason_code=ReasonCode.POISON_BATCH_SKIPPED,
        )
        self.runner.restart(skipping, self._writer(skipping))
        return True

    def _stalled(self, query_id: str, stall: str) -> None:
        """A stalled batch was cancelled: counted (status, metrics) and said once; supervision
        restarts the graph from its checkpoint like any failure."""
        self.stalls[query_id] = stall
        fenced_write(
            self._redis, self._fence, lambda batch: batch.hincrby(self._keys.counters, f"{STALLED}{query_id}", 1)
        )
        log.warning(
            "execution graph's batch stalled; restarting the graph from its checkpoint",
            query_id=query_id,
            reason=stall,
            reason_code=ReasonCode.BATCH_STALLED,
        )

    def hold_to_error_budgets(self, budgets: dict[str, tuple[int, float]]) -> None:
        """The queries under an automatic rollback's error budget now: each fails for good at its
        failure number `allowed + 1` within `span_s` seconds, whatever restarts it has left."""
        self._error_budgets = budgets

    def under_error_budget(self, query_id: str) -> bool:
        return query_id in self._error_budgets

    def _over_error_budget(self, query_id: str, restarts: RestartBudget, now: float) -> str | None:
        budget = self._error_budgets.get(query_id)
        if budget is None:
            return None
        allowed, span_s = budget
        seen = restarts.failures_within(span_s, now)
        if seen <= allowed:
            return None
        return f"{seen} failures within {span_s:g}s, over auto-rollback's error budget of {allowed}"

    def _writer(self, record: GraphRecord) -> ResultWriter:
        fence = self._fence
        check = None if fence is None else (lambda: fence.verify(self._redis))
        # Each batch emits only the windows this graph owns, as the journal says at that batch
        # (contract.ownership; docs/architecture.md, "The ownership filter").
        return ResultWriter(
            self._kafka,
            self._pipeline.sink_topic,
            record.query_id,
            record.group_columns,
            check,
            owned=OwnershipReader(self._redis, self._keys, record),
            key_window_end=record.windowing.sliding,
            unowned_topic=record.shadow_results_topic,
            table=self._sink_table(record),
        )

    def _sink_table(self, record: GraphRecord) -> ResultTable | None:
        """The sink's table, where the sink is one: one per graph (a Postgres graph keeps a connection
        of its own), the same across the graph's restarts, closed once its query stops for good."""
        sink = self._pipeline.sink
        table = self._tables.get(record.query_id)
        if table is None and sink.kind is SinkKind.DELTA:
            table = DeltaTable(sink, record.spark_query_id)
        elif table is None and sink.kind is SinkKind.POSTGRES:
            assert self._pipeline.sink_url is not None  # settings refuse a postgres sink without one
            table = PostgresTable(sink, self._pipeline.sink_url)
        if table is not None:
            self._tables[record.query_id] = table
        return table

    def close_tables(self) -> None:
        """Close every graph's sink table (their queries stopped: the executor is stopping)."""
        for query_id in list(self._tables):
            self._close_table(query_id)

    def _close_table(self, query_id: str) -> None:
        table = self._tables.pop(query_id, None)
        if table is not None:
            table.close()

    def stop(self, query_id: str) -> bool:
        """Stop a drained graph's query at once; returns whether it stopped within `stop_wait_s` (else
        the stop goes on, on its own thread, and the next call waits for it again).

        Only a drained graph retires: it has emitted and committed every window it owns, so a batch
        still in flight has nothing to emit and is cancelled, not waited for. (A busy graph is rarely
        between batches: waiting took 5-7 s of every swap, and blocked the tick.) A batch hung in a
        task may keep Spark's stop() from returning: the loop never waits for it longer than this.
        """
        stopping = self._stopping.get(query_id)
        if stopping is None:
            stopping = threading.Thread(
                target=self.runner.stop,
                args=(query_id,),
                kwargs={"finish_batch": False},
                name=f"hotswap-retire-{query_id}",
                daemon=True,
            )
            self._stopping[query_id] = stopping
            stopping.start()
        stopping.join(self.stop_wait_s)
        if stopping.is_alive():
            return False
        del self._stopping[query_id]
        self._close_table(query_id)
        return True

    def remove_topic(self, record: GraphRecord) -> None:
        """Delete a retired graph's topic (unless retired topics are kept, or another graph reads it)."""
        if not self._pipeline.keep_retired_topics and not self._topic_in_use(record):
            self._topics.delete(record.topic)

    def discard(self, query_id: str) -> None:
        """Remove a graph that never served (its swap failed or was aborted before the cut, or no open
        swap needs it): its query stops, it is recorded `discarded`, and its topic goes unless another
        graph reads it."""
        self.runner.stop(query_id)
        self._close_table(query_id)
        record = self.get(query_id)
        if record is not None:
            if not record.state.is_ended:
                self.save(record.moved(GraphState.DISCARDED))
            if not self._topic_in_use(record):
                self._topics.delete(record.topic)

    def forget(self, record: GraphRecord) -> None:
        """Remove what a retired or discarded graph left behind (retention): its checkpoint, then its
        record, progress and counters (its topics go with the sweep's). Each step can be repeated, so a
        crash halfway is finished by the next sweep."""
        assert record.state.is_ended, record.query_id
        self.runner.remove_checkpoint(record.query_id)
        base, number = numbered(record.query_id)
        raw = self._redis.hget(self._keys.forgotten_names, base)

        def queue(batch: Batch) -> None:
            batch.hdel(self._keys.graphs, record.query_id)
            batch.delete(self._keys.progress(record.query_id))
            for counter in (STALLED, SKIPPED, ROUTED):
                batch.hdel(self._keys.counters, f"{counter}{record.query_id}")
            if raw is None or int(raw) < number:
                batch.hset(self._keys.forgotten_names, base, str(number))

        fenced_write(self._redis, self._fence, queue)
        self._restarts.pop(record.query_id, None)
        self.stalls.pop(record.query_id, None)

    def _topic_in_use(self, record: GraphRecord) -> bool:
        """Whether another graph still needs this graph's topic: one that took over a failed graph's
        buffer, or the failed graph itself (it owns its windows until it is retired): any that has
        not ended."""
        return any(
            other.topic == record.topic and other.query_id != record.query_id and not other.state.is_ended
            for other in self.records().values()
        )


def numbered(query_id: str) -> tuple[str, int]:
    """A query id as its name and number: `count-3` is (`count`, 3), `count` is (`count`, 1)."""
    base, _, suffix = query_id.rpartition("-")
    if base and suffix.isdigit() and int(suffix) >= 2:
        return base, int(suffix)
    return query_id, 1
