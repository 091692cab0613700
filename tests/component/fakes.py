"""Fakes for the component tests: the control plane's own code on fakeredis, with Spark, Kafka and
time replaced. Graph records, the journal, the swap protocol and the lease are the real ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import fakeredis
from pyspark.sql import SparkSession
from redis.client import Pipeline

from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphProgress, GraphRecord, GraphState, QueryKind, QuerySource
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.contract.source import SourceSpec
from hotswap.execution_graph.errors import GraphStartFailed, QueryRejected
from hotswap.execution_graph.validation import QueryShape, check_cuttable
from hotswap.executor.control.graphs import Graphs
from hotswap.executor.control.swap import SwapProtocol
from hotswap.executor.control.topics import Topics
from hotswap.service_sink.progress import ProgressReporter

# Never touched: the parts of Graphs that need Spark (validation, the runner) are faked below.
NO_SPARK = cast(SparkSession, None)


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


def query(name: str, window_ms: int = 10_000) -> QuerySource:
    """A query whose (fake) analysis finds windows of `window_ms`."""
    return QuerySource(name=name, kind=QueryKind.SQL, text=str(window_ms))


class FakeRunner:
    """The graphs' Spark queries as a dict: query id -> why it died, None while it runs."""

    def __init__(self) -> None:
        self.queries: dict[str, str | None] = {}
        self.started: list[str] = []
        self.restarted: list[str] = []
        self.stopped: list[str] = []
        self.cancelled: list[str] = []  # stopped without waiting for the batch in flight
        self.start_fails: dict[str, str] = {}  # query id -> why its start fails

    def start(self, record: GraphRecord, writer: object) -> None:
        self.started.append(record.query_id)
        self.queries[record.query_id] = None

    def wait_running(self, query_id: str, timeout_s: float) -> None:
        reason = self.start_fails.get(query_id)
        if reason is not None:
            self.queries[query_id] = reason
            raise GraphStartFailed(f"execution graph {query_id} failed to start: {reason}")

    def restart(self, record: GraphRecord, writer: object) -> None:
        self.restarted.append(record.query_id)
        self.queries[record.query_id] = None

    def die(self, query_id: str, reason: str) -> None:
        self.queries[query_id] = reason

    def failure(self, query_id: str) -> str | None:
        return self.queries.get(query_id)

    def query_ids(self) -> list[str]:
        return list(self.queries)

    def stop(self, query_id: str, *, finish_batch: bool = True) -> None:
        if query_id in self.queries:
            del self.queries[query_id]
            self.stopped.append(query_id)
            if not finish_batch:
                self.cancelled.append(query_id)

    def last_commit_watermark(self, query_id: str) -> int | None:
        return None


class FakeTopics:
    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []

    def ensure(self, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
        self.created.append(topic)

    def delete(self, topic: str) -> None:
        self.deleted.append(topic)


class SparklessGraphs(Graphs):
    """The real Graphs (records, deploy, supervise, retire, discard) with Spark and Kafka faked:
    validation reads the window size from the query text, and queries are FakeRunner entries."""

    def __init__(self, settings: Settings, client: fakeredis.FakeRedis, clock: Callable[[], float]) -> None:
        self.fake_runner = FakeRunner()
        self.fake_topics = FakeTopics()
        super().__init__(NO_SPARK, settings, client, cast(Topics, self.fake_topics), clock=clock)
        self.runner = self.fake_runner  # type: ignore[assignment]  # structurally the part of GraphRunner used
        self.validated: list[str] = []
        self.refuse: dict[str, str] = {}  # query name -> the one-line reason validation gives
        self.crash: dict[str, Exception] = {}  # query name -> what the user's code raises while analysed

    def validate(self, source: QuerySource, running_window_ms: int | None, reads: SourceSpec) -> QueryShape:
        self.validated.append(source.name)
        if source.name in self.refuse:
            raise QueryRejected(self.refuse[source.name])
        if source.name in self.crash:
            raise self.crash[source.name]
        window_ms = int(source.text)
        if running_window_ms is not None:
            check_cuttable(running_window_ms, window_ms)
        return QueryShape(window_ms=window_ms, columns=(), group_columns=())


class FakeReporter:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, query_id: str) -> None:
        self.forgotten.append(query_id)


class World:
    """One namespace's control plane: the executor's side (protocol, graphs) and helpers that play
    the service graph (cuts) and the service sink (progress reports)."""

    def __init__(self, settings: Settings, client: fakeredis.FakeRedis | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.client = client or fakeredis.FakeRedis()
        self.clock = ManualClock()
        self.graphs = SparklessGraphs(settings, self.client, self.clock)
        self.reporter = FakeReporter()
        self.protocol = SwapProtocol(
            settings, self.client, self.graphs, cast(ProgressReporter, self.reporter), clock=self.clock
        )
        self.journal = Journal(self.client, self.keys)
        self._batch = 0

    def serve(self, name: str, window_ms: int = 10_000) -> GraphRecord:
        """`hotswap run --query`: the namespace's first query, running and current."""
        record = GraphRecord(
            query_id=name,
            source=query(name, window_ms),
            window_ms=window_ms,
            topic=self.settings.names.graph_topic(name),
        )
        running = self.graphs.deploy(record)
        self.graphs.set_current(running)
        return running

    def submit(self, name: str, window_ms: int = 10_000, swap_id: str | None = None) -> str:
        """What `hotswap submit` writes (then it waits for the executor to validate)."""
        swap_id = swap_id or f"s-{name}-{len(self.journal.all())}"
        self.journal.create(SwapRecord(id=swap_id, to_query=name, source=query(name, window_ms)))
        return swap_id

    def state(self, swap_id: str) -> SwapPhase:
        return self.journal.get(swap_id).state

    def graph_state(self, query_id: str) -> GraphState | None:
        record = self.graphs.get(query_id)
        return None if record is None else record.state

    def cut(self, swap_id: str, boundary: int) -> SwapRecord | None:
        """The service graph takes the cut at a batch boundary, as service_graph.query does."""
        self._batch += 1
        return self.journal.record_cut(swap_id, boundary, self._batch)

    def watermark_passes_cut(self, swap_id: str) -> None:
        """The service watermark passed W: the service graph records `draining` and writes markers."""
        self.journal.record_draining(swap_id)
        self.journal.update(swap_id, markers_written=True)

    def emitted_through(self, query_id: str, watermark: int) -> None:
        """The service sink reports that the graph committed its windows through `watermark`."""
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
    """A client whose next transaction is interrupted: `rival` runs (through another connection)
    after the transaction WATCHed and read its keys and just before its EXEC, once."""

    def __init__(self, *, server: fakeredis.FakeServer) -> None:
        super().__init__(server=server)
        self.rival: Callable[[], object] | None = None
        self.execs = 0  # EXEC attempts, the retries of a WATCH conflict included

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _HookedPipeline(self, transaction, shard_hint)


class _HookedPipeline(Pipeline):
    def __init__(self, owner: RacingRedis, transaction: bool, shard_hint: Any) -> None:
        super().__init__(owner.connection_pool, owner.response_callbacks, transaction, shard_hint)
        self._owner = owner

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self._owner.execs += 1
        rival, self._owner.rival = self._owner.rival, None
        if rival is not None:
            rival()
        return super().execute(raise_on_error)
