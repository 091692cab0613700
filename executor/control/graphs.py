"""The execution graphs of one namespace: their records in Redis and their Spark queries.

A graph's record is written before the action it describes (starting, retiring), so a
restarted executor can finish what was begun.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
import structlog
from pyspark.sql import SparkSession

from hotswap.contract.fence import Fence, fenced_write
from hotswap.contract.lifecycle import RestartBudget
from hotswap.contract.models import CurrentQuery, GraphRecord, GraphState, QuerySource, now_ms
from hotswap.contract.names import Keys
from hotswap.contract.ownership import read_owned_windows
from hotswap.contract.records import read_current, read_graphs
from hotswap.contract.settings import Settings
from hotswap.contract.source import LEGACY_SOURCE, SourceFormat, SourceSpec
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.graph import GraphRunner, events_stream
from hotswap.execution_graph.schemas import check_version
from hotswap.execution_graph.validation import QueryShape, validate_query
from hotswap.executor.control.topics import Topics
from hotswap.service_sink.results import ResultWriter

log = structlog.get_logger(__name__)

GRAPH_TOPIC_PARTITIONS = 1


class Graphs:
    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        client: redis.Redis,
        topics: Topics,
        fence: Fence | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fence = fence
        self._clock = clock  # measures restart back-off and healthy time (tests move it by hand)
        self._spark = spark
        self._settings = settings
        self._redis = client
        self._keys = Keys(settings.namespace)
        self._topics = topics
        self.runner = GraphRunner(spark, settings)
        self._restarts: dict[str, RestartBudget] = {}
        # The namespace's resolved source (set when the executor starts): what a query reads unless
        # it or its predecessor declares its own schema.
        self.namespace_source: SourceSpec = LEGACY_SOURCE

    # -- records ---------------------------------------------------------------------------
    def records(self) -> dict[str, GraphRecord]:
        return read_graphs(self._redis, self._keys)

    def get(self, query_id: str) -> GraphRecord | None:
        raw = self._redis.hget(self._keys.graphs, query_id)
        return None if raw is None else GraphRecord.model_validate_json(raw)

    def save(self, record: GraphRecord) -> None:
        fenced_write(
            self._redis,
            self._fence,
            lambda pipe: pipe.hset(self._keys.graphs, record.query_id, record.model_dump_json()),
        )

    def current(self) -> CurrentQuery | None:
        return read_current(self._redis, self._keys)

    def set_current(self, record: GraphRecord) -> None:
        current = CurrentQuery(query_id=record.query_id, started_at=record.started_at or now_ms())
        fenced_write(self._redis, self._fence, lambda pipe: pipe.set(self._keys.current, current.model_dump_json()))

    def unique_id(self, name: str, taken: set[str]) -> str:
        used = set(self.records()) | taken
        if name not in used:
            return name
        n = 2
        while f"{name}-{n}" in used:
            n += 1
        return f"{name}-{n}"

    # -- validation ------------------------------------------------------------------------
    def validate(self, source: QuerySource, running_window_ms: int | None, reads: SourceSpec) -> QueryShape:
        """Analyse the query over the `events` its version would read (`reads`), over a stream of a
        topic that is never started, so nothing is read. `running_window_ms`: the spacing of the
        running query's window ends (its slide; its size when tumbling)."""
        stream = events_stream(self._spark, self._settings, self._settings.names.graph_topic("validation"), reads)
        return validate_query(self._spark, source, stream, running_window_ms)

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
    def deploy(self, record: GraphRecord) -> GraphRecord:
        """Create the graph's topic, start its query and wait until it runs.

        The topic has one partition: rows and the watermark markers after them stay in the order
        the service graph wrote them, so the graph never reads a marker before rows it covers.
        """
        self.save(record)
        self._topics.ensure(record.topic, GRAPH_TOPIC_PARTITIONS)
        self.runner.start(record, self._writer(record))
        self.runner.wait_running(record.query_id, self._settings.deploy_timeout_s)
        running = record.changed(state=GraphState.RUNNING, started_at=record.started_at or now_ms())
        self.save(running)
        return running

    def supervise(self) -> list[tuple[GraphRecord, str]]:
        """Restart dead graph queries from their checkpoints, with doubling back-off.

        Returns the graphs whose restart budget is spent, with the last failure; they are marked
        failed and no longer restarted (an executor restart tries them again).
        """
        exhausted: list[tuple[GraphRecord, str]] = []
        now = self._clock()
        for query_id in self.runner.query_ids():
            failure = self.runner.failure(query_id)
            restarts = self._restarts.setdefault(
                query_id, RestartBudget(self._settings.query_restarts, self._settings.query_restart_backoff_s)
            )
            if failure is None:
                restarts.healthy(now)
                continue
            record = self.get(query_id)
            if record is None:
                continue
            if restarts.exhausted:
                log.error(
                    "execution graph failed for good", query_id=query_id, attempts=restarts.attempts, error=failure
                )
                self.runner.stop(query_id)
                self.save(record.changed(state=GraphState.FAILED))
                exhausted.append((record, failure))
                continue
            if restarts.first_seen(now):
                log.warning("execution graph failed; restarting from its checkpoint", query_id=query_id, error=failure)
            if restarts.restart_due(now):
                self.runner.restart(record, self._writer(record))
        return exhausted

    def _writer(self, record: GraphRecord) -> ResultWriter:
        fence = self._fence
        check = None if fence is None else (lambda: fence.verify(self._redis))
        # Each batch emits only the windows this graph owns, as the journal says at that batch
        # (contract.ownership; docs/architecture.md, "The ownership filter").
        return ResultWriter(
            self._settings,
            record.query_id,
            record.group_columns,
            check,
            owned=lambda: read_owned_windows(self._redis, self._keys, record),
            key_window_end=record.windowing.sliding,
        )

    def resume(self, record: GraphRecord) -> GraphRecord:
        """Restart a graph that was starting or running when the executor stopped."""
        log.info("resuming execution graph", query_id=record.query_id, state=record.state)
        return self.deploy(record)

    def retire(self, query_id: str) -> None:
        """Stop the graph's query and remove its topic (unless retired topics are kept)."""
        # Only a drained graph retires: it has emitted and committed every window it owns, so a
        # batch still in flight has nothing to emit and is cancelled, not waited for. (A busy
        # graph is rarely between batches: waiting took 5-7 s of every swap, and blocked the tick.)
        self.runner.stop(query_id, finish_batch=False)
        record = self.get(query_id)
        if record is None:
            return
        if record.state is not GraphState.RETIRED:
            self.save(record.changed(state=GraphState.RETIRED, retired_at=now_ms()))
        if not self._settings.keep_retired_topics and not self._topic_in_use(record):
            self._topics.delete(record.topic)
        log.info("execution graph retired", query_id=query_id)

    def discard(self, query_id: str) -> None:
        """Remove a graph that never served (its swap failed or was aborted before the cut)."""
        self.runner.stop(query_id)
        record = self.get(query_id)
        if record is not None:
            self.save(record.changed(state=GraphState.FAILED, retired_at=now_ms()))
            if not self._topic_in_use(record):
                self._topics.delete(record.topic)

    def _topic_in_use(self, record: GraphRecord) -> bool:
        """Whether another graph still needs this graph's topic: one that took over a failed graph's
        buffer, or the failed graph itself (it owns its windows until it is retired)."""

        def needs(other: GraphRecord) -> bool:
            failed_owner = other.state is GraphState.FAILED and other.retired_at is None
            return other.state in (GraphState.STARTING, GraphState.RUNNING) or failed_owner

        return any(
            other.topic == record.topic and other.query_id != record.query_id and needs(other)
            for other in self.records().values()
        )
