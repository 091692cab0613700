"""Running user queries as Spark streaming queries, one per execution graph, on either engine
(contract.models.GraphEngine; docs/architecture.md, "Two graph engines").

A stateful graph reads its own single-partition input topic, in which the service graph writes data
rows and, after each of its batches, a watermark marker. Spark's watermark is applied with a delay so
large (contract.windows.GRAPH_WATERMARK_DELAY_MS) that data rows never move it; only markers do,
so the graph closes windows on the service watermark and never drops a row the service graph
routed as on time, whatever the skew between source partitions or the size of a backlog (see
docs/architecture.md, "One watermark"). One partition keeps every row before the markers that follow it, so
any bounded prefix of the topic is consistent. Markers are dropped right after the watermark node by a
condition on the event-time column, which Spark keeps above that node (a filter on another column would
be pushed below it and swallow the marker; docs/architecture.md, "Known traps").

A closing graph (execution_graph.closing) reads a topic of any number of partitions, keeps the
one-watermark rule itself, and computes each window once, as a batch, in the batch that closes it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.listener import StreamingQueryProgress

from hotswap.contract.causes import first_line
from hotswap.contract.lifecycle import BatchWatch, stall_text, stop_between_batches
from hotswap.contract.models import GraphEngine, GraphRecord, SkippedRows
from hotswap.contract.rewrites import Rewrite
from hotswap.contract.settings import KafkaSettings, PipelineSettings, QueryRules, Timeouts
from hotswap.execution_graph.checkpoint import CheckpointFiles, GraphFiles, graph_files
from hotswap.execution_graph.closing import FAILED_FILE, WindowCloser, closing_state
from hotswap.execution_graph.closing_query import ClosingQuery, TopicEnds
from hotswap.execution_graph.confinement import isolated_session
from hotswap.execution_graph.errors import GraphStartFailed
from hotswap.execution_graph.events import batch_events, events_stream, graph_batch_cap
from hotswap.execution_graph.task_slots import SHUFFLE_PARTITIONS, leave_a_slot, tasks_may_run_twice
from hotswap.execution_graph.user_query import apply_query, prepare_query

__all__ = ["GraphQuery", "GraphRunner", "claim_checkpoint", "events_stream"]

log = structlog.get_logger(__name__)

BatchWriter = Callable[[DataFrame, int], None]


class GraphQuery(Protocol):
    """A running graph: a Spark streaming query (stateful engine) or a ClosingQuery (closing engine)."""

    @property
    def name(self) -> str: ...

    @property
    def runId(self) -> str: ...

    @property
    def isActive(self) -> bool: ...

    @property
    def status(self) -> dict[str, Any]: ...

    @property
    def lastProgress(self) -> StreamingQueryProgress | None: ...

    @property
    def recentProgress(self) -> list[StreamingQueryProgress]: ...

    def exception(self) -> BaseException | None: ...

    def stop(self) -> None: ...


def claim_checkpoint(files: CheckpointFiles, where: str, record: GraphRecord) -> None:
    """Make sure Spark resumes this graph's own checkpoint (`files`, at `where`) and no other.

    Spark keeps its query's id in `<checkpoint>/metadata` and writes one only if the file is
    missing. hotswap writes it first, whole or not at all (a temporary file, synced, then renamed),
    with the id chosen when the graph was recorded, so a checkpoint left from an earlier life of the
    namespace (one whose control state was lost) is refused instead of being resumed as if it
    belonged to this graph. A metadata file that cannot be read (damaged where it is stored) is
    written again when the checkpoint holds no batch yet, as nothing can have used it; otherwise it
    is refused with its own advice.
    """
    text = files.read_text("metadata")
    if text is None:
        files.write_once("metadata", json.dumps({"id": record.spark_query_id}) + "\n")
        return
    try:
        found = json.loads(text.strip().splitlines()[0]).get("id")
    except (ValueError, IndexError, AttributeError):
        found = None
    if found == record.spark_query_id:
        return
    if found is None:
        if not files.has_entries("offsets"):
            log.warning("checkpoint metadata unreadable, before any batch: written again", checkpoint=where)
            files.replace("metadata", json.dumps({"id": record.spark_query_id}) + "\n")
            return
        raise GraphStartFailed(
            f"checkpoint {where} has a metadata file that cannot be read, and batches, so whose it is cannot be told: "
            f"if it is graph {record.query_id}'s, restore the file with its id {record.spark_query_id}; else start "
            "the namespace over with `hotswap run --reset-namespace`"
        )
    raise GraphStartFailed(
        f"checkpoint {where} belongs to Spark query {found}, not to graph {record.query_id} "
        f"({record.spark_query_id}); it is left from an earlier life of the namespace: start the namespace "
        "over with `hotswap run --reset-namespace`"
    )


class GraphRunner:
    """Starts, finds and stops the Spark queries of execution graphs.

    A deploy never blocks the executor's loop: `begin` starts a query on a thread of its own (building
    a user query may take long: its code runs, and Spark plans it), and `ready` says, without
    waiting, whether it runs yet.
    """

    def __init__(
        self,
        spark: SparkSession,
        pipeline: PipelineSettings,
        kafka: KafkaSettings,
        rules: QueryRules,
        timeouts: Timeouts,
        rewrites: Callable[[], Iterable[Rewrite]] | None = None,
    ) -> None:
        self._spark = spark
        # What closing graphs learn of replayed service batches (contract.rewrites); None: every
        # window is deduplicated.
        self._rewrites = rewrites
        self._pipeline = pipeline
        self._kafka = kafka
        self._rules = rules
        self._timeouts = timeouts
        self._queries: dict[str, GraphQuery] = {}
        self._lock = threading.Lock()
        self._starting: dict[str, Future[GraphQuery]] = {}
        self._unwanted: set[str] = set()  # stopped while starting: stopped again once started
        self._closers: dict[str, WindowCloser] = {}  # the closing graphs' batch functions
        self._checkpoints: dict[str, GraphFiles] = {}  # each graph's checkpoint directory, looked up once
        self._closing: dict[str, ClosingQuery] = {}  # the closing graphs' queries, by query id
        self._watches: dict[str, BatchWatch] = {}  # each graph's batch in flight (batch_stall_timeout)
        self._stalls: dict[str, str] = {}  # graphs whose stalled batch was cancelled: why
        # Set each time a closing graph commits a batch, so that a swap waiting for its old graph's
        # last windows sees them at once rather than at its next look (executor's loop).
        self.batch_committed = threading.Event()

    def start(self, record: GraphRecord, writer: BatchWriter) -> GraphQuery:
        """Start the graph's query now (or return it, if it runs), on the caller's thread."""
        with self._lock:
            existing = self._queries.get(record.query_id)
        if existing is not None and existing.isActive:
            return existing
        query = self._start(record, writer)
        with self._lock:
            self._queries[record.query_id] = query
        return query

    def _start(self, record: GraphRecord, writer: BatchWriter) -> GraphQuery:
        checkpoint = self._pipeline.names.graph_checkpoint(record.query_id)
        claim_checkpoint(self._files(record.query_id), str(checkpoint), record)
        # The graph's own session: the user's text never runs on the executor's (confinement.py).
        session = isolated_session(self._spark, self._rules.static_tables)
        tables = tuple(self._rules.static_tables)
        query_tasks = int(str(session.conf.get(SHUFFLE_PARTITIONS)))
        if record.engine is GraphEngine.CLOSING:
            # A closing batch is a few small jobs on a few thousand rows: adaptive execution's
            # re-planning at each shuffle costs more than it saves there (its shuffles then use
            # spark.sql.shuffle.partitions as set, 2 by default; raise it for big windows).
            session.conf.set("spark.sql.adaptive.enabled", "false")
            compute = prepare_query(record.source, tables)
            # Applied once now, to an empty batch: a query that no longer analyses fails its start, as a
            # stateful graph's does; then once for each batch that closes windows.
            compute(batch_events(session, record.reads))
            files = self._files(record.query_id)
            name = self._pipeline.names.graph_query(record.query_id)
            # Where Spark may run a task of the service graph's write twice, no replay is recorded.
            rewrites = None if tasks_may_run_twice(session) else self._rewrites
            closer = WindowCloser(
                self._kafka, record, compute, writer, files, name, query_tasks=query_tasks, rewrites=rewrites
            )
            closing = ClosingQuery(
                session,
                name=name,
                query_id=record.spark_query_id,
                topic=record.topic,
                closer=closer,
                files=files,
                ends=TopicEnds(self._kafka.kafka_python_config(), record.topic, record.partitions),
                cap=graph_batch_cap(self._pipeline),
                slide_ms=record.windowing.slide_ms,
                retry_deadline_s=self._timeouts.retry_deadline.s,
                on_commit=self.batch_committed.set,
            )
            with self._lock:
                self._closers[record.query_id] = closer
                self._closing[record.query_id] = closing
            closing.start()
            self._log_started(record)
            return closing
        else:
            leave_a_slot(session, query_tasks)  # its state's partitions; a checkpoint keeps its own
            events = events_stream(
                session, self._pipeline, self._kafka, record.topic, record.reads, record.reads_from, record.skipped
            )
            output = apply_query(events, record.source, tables)
            stream = (
                output.writeStream.queryName(self._pipeline.names.graph_query(record.query_id))
                .outputMode("append")
                .option("checkpointLocation", str(checkpoint))
                .foreachBatch(writer)
            )
        if self._pipeline.processing_time is not None:
            stream = stream.trigger(processingTime=self._pipeline.processing_time)
        query = stream.start()
        self._log_started(record)
        return query

    def _log_started(self, record: GraphRecord) -> None:
        log.info(
            "execution graph started",
            query_id=record.query_id,
            topic=record.topic,
            engine=str(record.engine),
            partitions=record.partitions,
        )

    def markers_taken(self, topic: str, watermark: int, offsets: Mapping[int, int]) -> None:
        """The service graph's marker producer: Kafka took a marker at `watermark` in every partition
        of `topic`, at `offsets`. A closing graph reading that topic looks whether a window closes
        (on the producer's thread)."""
        with self._lock:
            readers = [c for c in self._closing.values() if c.topic == topic]
        for closing in readers:  # a failed graph and its successor may read one topic
            closing.notify(watermark, offsets)

    def begin(self, record: GraphRecord, writer: BatchWriter) -> None:
        """Start the graph's query on a thread of its own, unless it runs or is starting already."""
        query_id = record.query_id
        with self._lock:
            existing = self._queries.get(query_id)
            if query_id in self._starting or (existing is not None and existing.isActive):
                return
            self._unwanted.discard(query_id)
            future: Future[GraphQuery] = Future()
            self._starting[query_id] = future

        def run() -> None:
            try:
                query = self._start(record, writer)
            except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything: `ready` reports it
                future.set_exception(exc)
                return
            with self._lock:
                unwanted = query_id in self._unwanted
                if not unwanted:
                    self._queries[query_id] = query
                else:
                    self._closing.pop(query_id, None)
            if unwanted:  # stopped (aborted, failed) while it was starting
                stop_between_batches(query, timeout_s=0.0)
            future.set_result(query)

        threading.Thread(target=run, name=f"hotswap-start-{query_id}", daemon=True).start()

    def ready(self, query_id: str) -> bool:
        """Whether the graph's query runs (active, and past its source's initialisation), without
        waiting; raises GraphStartFailed if it could not start or died."""
        with self._lock:
            future = self._starting.get(query_id)
            query = self._queries.get(query_id)
        if future is not None:
            if not future.done():
                return False
            with self._lock:
                self._starting.pop(query_id, None)
            failure = future.exception()
            if failure is not None:
                raise GraphStartFailed(f"execution graph {query_id} failed to start: {first_line(failure)}")
            query = future.result()
        if query is None:
            raise GraphStartFailed(f"execution graph {query_id} failed to start: it is not running")
        died = query.exception()
        if died is not None or not query.isActive:
            reason = first_line(died) if died is not None else "it stopped"
            raise GraphStartFailed(f"execution graph {query_id} failed to start: {reason}")
        message = str(query.status.get("message", ""))
        return query.lastProgress is not None or message.startswith("Waiting")

    def is_committed(self, query_id: str, batch_id: int) -> bool:
        """Whether the graph's checkpoint holds `commits/<batch_id>`: that batch's output is out."""
        return self._files(query_id).exists(f"commits/{batch_id}")

    def batch_watermark(self, query_id: str, batch_id: int, spark_watermark: int | None) -> int | None:
        """How far the graph has closed windows after `batch_id`: Spark's watermark of that batch
        (from its progress report) for a stateful graph, its own closed-through for a closing one."""
        with self._lock:
            closer = self._closers.get(query_id)
        return spark_watermark if closer is None else closer.closed_through(batch_id)

    def last_commit_watermark(self, query_id: str) -> int | None:
        """The event-time watermark of the graph's last committed batch, read from its checkpoint:
        Spark records each batch's watermark in `offsets/N` and writes `commits/N` once the batch's
        output is out, so every window ending at or before it was emitted. A closing graph records
        how far it closed in its own state file of that batch."""
        files = self._files(query_id)
        batches = files.batch_ids("commits")
        if not batches:
            return None
        closing = closing_state(files, max(batches))
        if closing is not None:
            return closing.closed_through
        text = files.read_text(f"offsets/{max(batches)}") or ""
        lines = text.splitlines()
        try:
            return int(json.loads(lines[1])["batchWatermarkMs"]) if len(lines) > 1 else None
        except (ValueError, KeyError, TypeError):
            return None

    def failing_rows(self, record: GraphRecord) -> list[SkippedRows] | None:
        """The rows of the batch the graph failed on: its last planned batch, which has no commit.
        A stateful graph's batch read its offset range from the batch before; a closing graph's
        windows were computed over the ranges it wrote when it failed. None: no such batch."""
        files = self._files(record.query_id)
        planned = files.batch_ids("offsets")
        if not planned:
            return None
        batch_id = max(planned)
        if batch_id in files.batch_ids("commits"):
            return None  # nothing in flight failed: the query died between batches
        if record.engine is GraphEngine.CLOSING:
            text = files.read_text(FAILED_FILE)
            failed = json.loads(text) if text else None
            if failed is None or int(failed["batch_id"]) != batch_id:
                return None
            return [
                SkippedRows(
                    partition=int(p),
                    start=int(r[0]),
                    end=int(r[1]),
                    batch_id=batch_id,
                    since_ms=failed.get("since_ms"),
                    until_ms=failed.get("until_ms"),
                )
                for p, r in sorted(failed["offsets"].items())
            ]
        end = self._planned_offsets(files, record.topic, batch_id)
        start = self._planned_offsets(files, record.topic, batch_id - 1) if batch_id > 0 else {}
        return [
            SkippedRows(partition=p, start=start.get(p, 0), end=e, batch_id=batch_id)
            for p, e in sorted(end.items())
            if e > start.get(p, 0)
        ]

    def _planned_offsets(self, files: GraphFiles, topic: str, batch_id: int) -> dict[int, int]:
        """A batch's end offsets in the topic, from Spark's offset log (a version line, the batch's
        metadata, then one line per source)."""
        text = files.read_text(f"offsets/{batch_id}") or ""
        offsets: dict[int, int] = {}
        for line in text.splitlines()[2:]:
            source = json.loads(line)
            if isinstance(source, dict):
                offsets.update({int(p): int(o) for p, o in source.get(topic, {}).items()})
        return offsets

    def remove_checkpoint(self, query_id: str) -> None:
        """Delete a retired graph's checkpoint (through Hadoop's file system, so a checkpoint on a
        cluster's store goes too). Never called for a graph whose query runs."""
        with self._lock:
            self._checkpoints.pop(query_id, None)
        fs, root = self._checkpoint(query_id)
        if fs.exists(root):
            fs.delete(root, True)

    def _files(self, query_id: str) -> GraphFiles:
        """The graph's checkpoint directory (the executor's loop asks each tick whether a batch committed)."""
        with self._lock:
            files = self._checkpoints.get(query_id)
        if files is None:
            # Outside the lock: a store's client may take seconds to start, and the lock serves every graph.
            found = graph_files(self._spark, str(self._pipeline.names.graph_checkpoint(query_id)))
            with self._lock:
                files = self._checkpoints.setdefault(query_id, found)
        return files

    def _checkpoint(self, query_id: str) -> tuple[Any, Any]:
        """The Hadoop file system and root path of a graph's checkpoint (local or on a cluster's store)."""
        root = self._path(None, str(self._pipeline.names.graph_checkpoint(query_id)))
        return root.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration()), root

    def _path(self, parent: Any, child: str) -> Any:
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        path_class = jvm.org.apache.hadoop.fs.Path
        return path_class(child) if parent is None else path_class(parent, child)

    def running(self) -> dict[str, GraphQuery]:
        """The graphs' queries, by query id (a dead one stays until it is restarted or stopped)."""
        with self._lock:
            return dict(self._queries)

    def query(self, query_id: str) -> GraphQuery | None:
        with self._lock:
            return self._queries.get(query_id)

    def query_ids(self) -> list[str]:
        """Graphs whose query was started (not those still starting)."""
        with self._lock:
            return list(self._queries)

    def known(self) -> set[str]:
        """Graphs whose query runs, died, or is starting."""
        with self._lock:
            return set(self._queries) | set(self._starting)

    def restart(self, record: GraphRecord, writer: BatchWriter) -> GraphQuery:
        """Start a graph whose query died again, from its checkpoint."""
        with self._lock:
            self._queries.pop(record.query_id, None)
            self._stalls.pop(record.query_id, None)
            self._watches.pop(record.query_id, None)
        return self.start(record, writer)

    def failure(self, query_id: str) -> str | None:
        """One line describing why the graph's query died, or None while it is healthy."""
        query = self.query(query_id)
        if query is None or query.isActive:
            return None
        with self._lock:
            stall = self._stalls.get(query_id)
        if stall is not None:
            return stall
        failure = query.exception()
        return first_line(failure) if failure is not None else "stopped"

    def watch(self, query_id: str, now: float) -> str | None:
        """Look at the graph's batch in flight. One that has run longer than batch_stall_timeout is
        cancelled (its query stopped, on a thread of its own: a hung batch may take long to stop) and
        its graph reported failed with the stall (`failure`), so supervision restarts it from its
        checkpoint, which replays the batch exactly once. Returns the stall's line the first time."""
        query = self.query(query_id)
        if query is None:
            return None
        limit = self._timeouts.batch_stall_timeout
        with self._lock:
            watch = self._watches.setdefault(query_id, BatchWatch(None if limit is None else limit.s))
        running = watch.look(query, now)
        if running is None:
            return None
        stall = stall_text(running, limit)
        with self._lock:
            self._stalls[query_id] = stall
        threading.Thread(target=query.stop, name=f"hotswap-cancel-{query_id}", daemon=True).start()
        return stall

    def stop(self, query_id: str, *, finish_batch: bool = True) -> None:
        """Stop the graph's query; with `finish_batch`, after its batch in flight (up to 10 s)."""
        with self._lock:
            query = self._queries.pop(query_id, None)
            self._closers.pop(query_id, None)
            self._closing.pop(query_id, None)
            self._stalls.pop(query_id, None)
            self._watches.pop(query_id, None)
            if query_id in self._starting:
                self._unwanted.add(query_id)  # stopped by its starting thread once it runs
                self._starting.pop(query_id)
        if query is not None and query.isActive:
            times = stop_between_batches(query, timeout_s=10.0 if finish_batch else 0.0)
            log.info("execution graph stopped", query_id=query_id, waited_s=times.waited_s, stop_s=times.stop_s)

    def stop_all(self) -> None:
        for query_id in self.known():
            self.stop(query_id)
