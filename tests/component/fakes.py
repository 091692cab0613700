"""Fakes for the component tests: the control plane's own code on fakeredis, with Spark, Kafka and
time replaced. Graph records, the journal, the swap protocol, the lease and the service graph's
cut and drain (its tick, over the real routing core) are the real ones."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar, cast

import fakeredis
import redis
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from hotswap.contract import fence
from hotswap.contract.errors import HotswapError
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import (
    GraphProgress,
    GraphRecord,
    GraphState,
    NodePosition,
    QueryKind,
    QuerySource,
    ServiceState,
    SkippedRows,
    new_spark_query_id,
)
from hotswap.contract.names import Keys
from hotswap.contract.records import read_service_state
from hotswap.contract.settings import KafkaSettings, Settings
from hotswap.contract.source import SourceSpec
from hotswap.contract.windows import Windowing
from hotswap.execution_graph.errors import GraphStartFailed, QueryRejected
from hotswap.execution_graph.validation import QueryShape, check_cuttable
from hotswap.executor.control.admission import Worker
from hotswap.executor.control.graphs import Graphs
from hotswap.executor.control.requests import OperatorRequests
from hotswap.executor.control.swap import SwapProtocol
from hotswap.executor.control.topics import Topics
from hotswap.executor.operator.client import Client
from hotswap.service_graph.kafka_io import MarkerWriter, SourceOffsets
from hotswap.service_graph.query import ServiceGraph
from hotswap.service_graph.routing import Marker
from tests.conftest import DEMO_SOURCE

# Never touched: the parts of Graphs that need Spark (validation, the runner) are faked below.
NO_SPARK = cast(SparkSession, None)
# The longest a held validation waits for its release, so a broken test fails instead of hanging.
HOLD_LIMIT_S = 30.0

T = TypeVar("T")


def at_once(work: Callable[[], T], name: str) -> Future[T]:
    """A worker that runs an analysis on the caller's thread: it is done when the step looks at it,
    so each step decides every submitted swap, as the executor's loop does when analyses are quick.
    (Tests of the loop not waiting for an analysis use the executor's own worker thread.)"""
    future: Future[T] = Future()
    try:
        future.set_result(work())
    except BaseException as exc:  # noqa: BLE001 - handed on, as a worker thread does
        future.set_exception(exc)
    return future


class ManualClock:
    """A monotonic clock that only the test moves; `sleep` moves it instead of waiting."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def query(name: str, window_ms: int = 10_000, slide_ms: int | None = None) -> QuerySource:
    """A query whose (fake) analysis finds windows of `window_ms`, starting every `slide_ms` (None:
    tumbling)."""
    text = str(window_ms) if slide_ms is None else f"{window_ms}/{slide_ms}"
    return QuerySource(name=name, kind=QueryKind.SQL, text=text)


def graph_record(name: str, window_ms: int, topic: str) -> GraphRecord:
    """The record of a graph of `query(name, window_ms)` (tumbling), as the executor writes it."""
    return GraphRecord(
        query_id=name,
        source=query(name, window_ms),
        window_ms=window_ms,
        slide_ms=window_ms,
        topic=topic,
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )


class FakeRunner:
    """The graphs' Spark queries as a dict: query id -> why it died, None while it runs."""

    def __init__(self) -> None:
        self.queries: dict[str, str | None] = {}
        self.starting: dict[str, int] = {}  # query id -> readiness checks left before it runs
        self.started: list[str] = []
        self.restarted: list[str] = []
        self.stopped: list[str] = []
        self.cancelled: list[str] = []  # stopped without waiting for the batch in flight
        self.start_fails: dict[str, str] = {}  # query id -> why its start fails
        self.slow_start: dict[str, int] = {}  # query id -> readiness checks that say "not yet"
        self.ready_checks: list[str] = []
        self.stalling: dict[str, str] = {}  # query id -> its next batch stalls, with this line
        self.stop_hangs: dict[str, threading.Event] = {}  # query id -> its stop returns once this is set
        self.removed_checkpoints: list[str] = []
        self.failing: dict[str, list[SkippedRows]] = {}  # query id -> the rows of the batch it fails on
        # Each start (a resume's) waits here for the others: starts made one after another never pass it.
        self.start_together: threading.Barrier | None = None
        self.resume_fails: dict[str, str] = {}  # query id -> why its start (a resume's) fails
        self.batch_committed = threading.Event()  # GraphRunner's: a closing graph committed a batch

    def start(self, record: GraphRecord, writer: object) -> None:
        self.started.append(record.query_id)
        if self.start_together is not None:
            self.start_together.wait()  # raises BrokenBarrierError once its timeout passes
        reason = self.resume_fails.get(record.query_id)
        if reason is not None:
            raise GraphStartFailed(f"execution graph {record.query_id} failed to start: {reason}")
        self.queries[record.query_id] = None

    def begin(self, record: GraphRecord, writer: object) -> None:
        if record.query_id in self.starting or record.query_id in self.queries:
            return
        self.started.append(record.query_id)
        self.starting[record.query_id] = self.slow_start.get(record.query_id, 0)

    def ready(self, query_id: str) -> bool:
        self.ready_checks.append(query_id)
        if query_id in self.starting:
            reason = self.start_fails.get(query_id)
            if reason is not None:
                del self.starting[query_id]
                raise GraphStartFailed(f"execution graph {query_id} failed to start: {reason}")
            if self.starting[query_id] > 0:
                self.starting[query_id] -= 1
                return False
            del self.starting[query_id]
            self.queries[query_id] = None
        failure = self.queries.get(query_id, "it is not running")
        if failure is not None:
            raise GraphStartFailed(f"execution graph {query_id} failed to start: {failure}")
        return True

    def known(self) -> set[str]:
        return set(self.queries) | set(self.starting)

    def restart(self, record: GraphRecord, writer: object) -> None:
        self.restarted.append(record.query_id)
        self.queries[record.query_id] = None

    def die(self, query_id: str, reason: str) -> None:
        self.queries[query_id] = reason

    def failure(self, query_id: str) -> str | None:
        return self.queries.get(query_id)

    def watch(self, query_id: str, now: float) -> str | None:
        """A stall set in `stalling` is seen (and its query cancelled) at the next look."""
        stall = self.stalling.pop(query_id, None)
        if stall is not None and query_id in self.queries:
            self.queries[query_id] = stall
        return stall

    def query_ids(self) -> list[str]:
        return list(self.queries)

    def stop(self, query_id: str, *, finish_batch: bool = True) -> None:
        hang = self.stop_hangs.get(query_id)
        if hang is not None:
            hang.wait(30)
        self.starting.pop(query_id, None)
        if query_id in self.queries:
            del self.queries[query_id]
            self.stopped.append(query_id)
            if not finish_batch:
                self.cancelled.append(query_id)

    def last_commit_watermark(self, query_id: str) -> int | None:
        return None

    def failing_rows(self, record: GraphRecord) -> list[SkippedRows] | None:
        return self.failing.get(record.query_id)

    def remove_checkpoint(self, query_id: str) -> None:
        assert query_id not in self.queries, f"{query_id} still runs"
        assert query_id not in self.starting, f"{query_id} still starts"
        self.removed_checkpoints.append(query_id)


class FakeTopics:
    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.refuse: dict[str, HotswapError] = {}  # topic -> what Kafka's refusal to create it raises
        self.attempts: list[str] = []
        self.existing: set[str] = set()  # what the broker holds now

    def ensure(self, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
        self.attempts.append(topic)
        if topic in self.refuse:
            raise self.refuse[topic]
        self.created.append(topic)
        self.existing.add(topic)

    def delete(self, topic: str) -> None:
        self.deleted.append(topic)
        self.existing.discard(topic)

    def names(self, prefix: str) -> list[str]:
        return sorted(t for t in self.existing if t.startswith(prefix))

    def close(self) -> None:
        pass


class SparklessGraphs(Graphs):
    """The real Graphs (records, deploy, supervise, retire, discard) with Spark and Kafka faked:
    validation reads the window size from the query text, and queries are FakeRunner entries."""

    def __init__(self, settings: Settings, client: fakeredis.FakeRedis, clock: Callable[[], float]) -> None:
        self.fake_runner = FakeRunner()
        self.fake_topics = FakeTopics()
        super().__init__(
            NO_SPARK,
            client,
            cast(Topics, self.fake_topics),
            clock=clock,
            pipeline=settings.pipeline,
            kafka=settings.kafka,
            queries=settings.queries,
            timeouts=settings.timeouts,
            recovery=settings.recovery,
        )
        self.namespace_source = DEMO_SOURCE  # as the executor sets it when it starts
        self.runner = self.fake_runner  # type: ignore[assignment]  # structurally the part of GraphRunner used
        self.validated: list[str] = []
        self.refuse: dict[str, str] = {}  # query name -> the one-line reason validation gives
        self.crash: dict[str, BaseException] = {}  # query name -> what the user's code raises while analysed
        self.hold: dict[str, threading.Event] = {}  # query name -> its analysis lasts until this is set
        self.analysing: set[str] = set()  # queries whose analysis has begun and not ended

    def validate(self, source: QuerySource, running_window_ms: int | None, reads: SourceSpec) -> QueryShape:
        self.analysing.add(source.name)
        try:
            return self._analyse(source, running_window_ms)
        finally:
            self.analysing.discard(source.name)

    def _analyse(self, source: QuerySource, running_window_ms: int | None) -> QueryShape:
        held = self.hold.get(source.name)
        if held is not None and not held.wait(HOLD_LIMIT_S):
            raise AssertionError(f"the analysis of {source.name!r} was never released")
        self.validated.append(source.name)
        if source.name in self.refuse:
            raise QueryRejected(self.refuse[source.name])
        if source.name in self.crash:
            raise self.crash[source.name]
        size, _, slide = source.text.partition("/")
        windows = Windowing.of(int(size), int(slide) if slide else None)
        if running_window_ms is not None:
            check_cuttable(running_window_ms, windows.grid_ms, slides=windows.sliding)
        return QueryShape(window_ms=windows.size_ms, slide_ms=windows.slide_ms, columns=(), group_columns=())


class FakeReporter:
    """The service sink's reporter: how far each graph has emitted, as the sink would confirm it."""

    def __init__(self) -> None:
        self.committed: dict[str, int] = {}
        self.forgotten: list[str] = []

    def committed_through(self, query_id: str) -> int | None:
        return self.committed.get(query_id)

    def forget(self, query_id: str) -> None:
        self.forgotten.append(query_id)


class ActiveQuery:
    """The service graph's Spark query, running between batches."""

    isActive = True  # noqa: N815 - pyspark's name


class RecordedMarkers(MarkerWriter):
    """The service graph's marker producer, keeping the markers instead of sending them."""

    def __init__(self, kafka: KafkaSettings) -> None:
        super().__init__(kafka)
        self.sent: list[Marker] = []

    def write(self, markers: list[Marker], *, wait: bool = False) -> None:
        self.sent.extend(markers)


class QuietSource(SourceOffsets):
    """Kafka's view of the source topic: nothing waiting to be read."""

    def end(self) -> dict[str, int]:
        return {}

    def log_start(self) -> dict[str, int]:
        return {}


def operator(settings: Settings, client: redis.Redis) -> Client:
    """The `hotswap` commands, with the executor's loop applying their requests between two polls,
    as its tick would (an executor holds the namespace's lease)."""
    keys = Keys(settings.namespace)
    client.set(keys.lease, "component-executor", nx=True)
    return Client(
        settings.control,
        settings.kafka,
        settings.pipeline,
        client,
        between_polls=OperatorRequests(client, keys, None).apply_pending,
    )


class World:
    """One namespace's control plane: the executor's side (protocol, graphs), the real service graph
    taking cuts and recording the drain on its tick (with Spark and Kafka faked), and a helper that
    plays the service sink (progress reports)."""

    def __init__(self, settings: Settings, client: fakeredis.FakeRedis | None = None, worker: Worker = at_once) -> None:
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.client = client or fakeredis.FakeRedis()
        self.clock = ManualClock()
        self.graphs = SparklessGraphs(settings, self.client, self.clock)
        self.reporter = FakeReporter()
        self.protocol = SwapProtocol(
            self.client,
            self.graphs,
            self.reporter,
            clock=self.clock,
            worker=worker,
            pipeline=settings.pipeline,
            timeouts=settings.timeouts,
            recovery=settings.recovery,
        )
        self.journal = Journal(self.client, self.keys)
        self.service = ServiceGraph(
            NO_SPARK,
            self.client,
            pipeline=settings.pipeline,
            kafka=settings.kafka,
            timeouts=settings.timeouts,
            recovery=settings.recovery,
        )
        self.service.query = cast(StreamingQuery, ActiveQuery())
        self.markers = RecordedMarkers(settings.kafka)
        self.service._markers = self.markers
        self.service._source = QuietSource(settings.kafka, settings.source_topic)

    def serve(self, name: str, window_ms: int = 10_000) -> GraphRecord:
        """`hotswap run --query`: the namespace's first query, running and current."""
        record = graph_record(name, window_ms, self.settings.names.graph_topic(name))
        return self.graphs.deploy_first(record, clock=self.clock)

    def operator(self) -> Client:
        return operator(self.settings, self.client)

    def submit(
        self, name: str, window_ms: int = 10_000, swap_id: str | None = None, *, slide_ms: int | None = None
    ) -> str:
        """What `hotswap submit` writes (then it waits for the executor to validate)."""
        swap_id = swap_id or f"s-{name}-{len(self.journal.all())}"
        self.journal.create(SwapRecord(id=swap_id, to_query=name, source=query(name, window_ms, slide_ms)))
        return swap_id

    def state(self, swap_id: str) -> SwapPhase:
        return self.journal.get(swap_id).state

    def graph_state(self, query_id: str) -> GraphState | None:
        record = self.graphs.get(query_id)
        return None if record is None else record.state

    def deploy(self, swap_id: str) -> SwapRecord:
        """Executor steps until the swap is deployed (one starts its graph, the next sees it run)."""
        for _ in range(3):
            self.protocol.step()
            if self.state(swap_id) is not SwapPhase.DEPLOYING and self.state(swap_id) is not SwapPhase.VALIDATED:
                break
        return self.journal.get(swap_id)

    def fail_until_spent(self, query_id: str, reason: str = "[USER_RAISED_EXCEPTION] poison row") -> None:
        """The graph's query dies with `reason`, restart after restart, until its restarts are spent."""
        for attempt in range(self.settings.query_restarts + 1):
            self.graphs.fake_runner.die(query_id, reason)
            failed = self.graphs.supervise()
            if failed:
                self.protocol.graphs_failed(failed)
            self.clock.advance(self.settings.query_restart_backoff.s * 2**attempt)
            self.graphs.supervise()

    def service_state(self, *, window_end: int | None = None, watermark: int | None = None) -> ServiceState:
        """Set what the service graph has routed: a partition's largest window end, and the watermark."""
        state = read_service_state(self.client, self.keys)
        partitions = dict(state.partitions)
        if window_end is not None:
            node = partitions.get("0", NodePosition())
            partitions["0"] = node.changed(window_end=max(node.window_end or 0, window_end), event_time=window_end - 1)
        watermark = watermark if watermark is not None else state.watermark
        changed = state.changed(partitions=partitions, watermark=watermark)
        self.client.set(self.keys.service, changed.model_dump_json())
        return changed

    def cut(self, swap_id: str, boundary: int) -> SwapRecord | None:
        """The service graph's tick takes the cut, as between batches: W is the first common
        boundary at or after the largest window routed, set here to `boundary`."""
        self.service_state(window_end=boundary)
        self.service.tick()
        swap = self.journal.get(swap_id)
        return swap if swap.state is SwapPhase.CUT and swap.cut_window_end == boundary else None

    def watermark_passes_cut(self, swap_id: str) -> None:
        """The service watermark passed W: the service graph's tick records `draining` and writes the
        old graph's end-of-window marker."""
        swap = self.journal.get(swap_id)
        assert swap.cut_window_end is not None
        self.service_state(watermark=swap.cut_window_end)
        self.service.tick()

    def emitted_through(self, query_id: str, watermark: int) -> None:
        """The service sink reports that the graph committed its windows through `watermark`."""
        self.reporter.committed[query_id] = watermark
        report = GraphProgress(query_id=query_id, committed_batch=1, committed_watermark=watermark)
        self.client.set(self.keys.progress(query_id), report.model_dump_json())

    def complete(self, swap_id: str, boundary: int) -> SwapRecord:
        """Play the service graph and sink through a whole swap that the executor deployed."""
        swap = self.journal.get(swap_id)
        assert swap.state is SwapPhase.DEPLOYED, swap.state
        assert swap.from_query is not None
        self.cut(swap_id, boundary)
        self.watermark_passes_cut(swap_id)
        self.emitted_through(swap.from_query, boundary)
        for _ in range(3):
            self.protocol.step()
            if self.state(swap_id).is_terminal:
                break
        return self.journal.get(swap_id)


class RacingRedis(fakeredis.FakeRedis):
    """A client whose next fenced write is interrupted: `rival` runs (through another connection)
    after the writer read the record and just before its write script runs, once."""

    def __init__(self, *, server: fakeredis.FakeServer) -> None:
        super().__init__(server=server)
        self.rival: Callable[[], object] | None = None
        self.writes = 0  # fenced write scripts run, the refused ones included

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        if sha == FENCED_WRITE_SHA:
            self.writes += 1
            rival, self.rival = self.rival, None
            if rival is not None:
                rival()
        return super().evalsha(sha, numkeys, *keys_and_args)


FENCED_WRITE_SHA = hashlib.sha1(fence._FENCED_WRITE.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA-1
