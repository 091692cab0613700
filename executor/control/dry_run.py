"""Answering dry runs (`hotswap submit FILE --dry-run`): validate a query against the running one
and say what a submit would do now, changing nothing.

The CLI leaves a request in Redis (contract.plans); the executor's loop takes it, validates the
query on a worker thread with admission's own analysis (admission.py: the same basis, the same
reasons; the loop never waits for it, and validation_timeout bounds it), and writes the plan back
with a time-to-live. Nothing else is written: no journal entry, no graph record, no topic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

import redis
import structlog
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from hotswap.contract.journal import Journal
from hotswap.contract.models import GraphRecord
from hotswap.contract.names import Keys
from hotswap.contract.plans import DRY_RUN_TTL_S, DryRunPlan, DryRunRequest
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.records import read_current, read_graphs_named, read_service_state
from hotswap.contract.settings import KafkaSettings, PipelineSettings, Timeouts
from hotswap.contract.windows import cut_boundary
from hotswap.execution_graph.graph import events_stream
from hotswap.executor.control.admission import Analyser, basis_for, not_validated_in_time, on_own_thread, rejection
from hotswap.executor.control.graphs import Graphs

log = structlog.get_logger(__name__)

ANSWERED_PER_TICK = 2  # a burst of dry runs must not hold the loop for long


def schema_ddl(schema: T.StructType) -> str:
    """A schema as DDL: `key STRING, value DOUBLE, ts BIGINT, event_time TIMESTAMP`."""
    return ", ".join(f"{field.name} {field.dataType.simpleString().upper()}" for field in schema.fields)


class DryRuns:
    def __init__(
        self,
        spark: SparkSession,
        client: redis.Redis,
        graphs: Graphs,
        worker: Callable[[Callable[[], DryRunPlan], str], Future[DryRunPlan]] = on_own_thread,
        clock: Callable[[], float] = time.monotonic,
        *,
        pipeline: PipelineSettings,
        kafka: KafkaSettings,
        timeouts: Timeouts,
    ) -> None:
        self._pipeline = pipeline
        self._kafka = kafka
        self._timeouts = timeouts
        self._spark = spark
        self._redis = client
        self._graphs = graphs
        self._analyser = Analyser(pipeline, graphs)
        self._keys = Keys(pipeline.names.namespace)
        self._worker = worker
        self._clock = clock
        self._pending: tuple[DryRunRequest, Future[DryRunPlan], float] | None = None  # the analysis in progress

    def answer_pending(self) -> None:
        """Start the analysis of the next waiting request on a worker thread, and answer those that
        are done (up to ANSWERED_PER_TICK); never waits. An analysis past validation_timeout is
        answered as such, and its thread abandoned: a `.py` query that sleeps cannot hold the loop."""
        for _ in range(ANSWERED_PER_TICK):
            if self._pending is None:
                request = self._next_request()
                if request is None:
                    return
                work = self._worker(partial(self.plan, request), f"hotswap-dry-run-{request.id}")
                self._pending = (request, work, self._clock())
            request, work, started = self._pending
            if work.done():
                plan = self._outcome(request, work)
            elif self._clock() - started > self._timeouts.validation_timeout.s:
                reason = not_validated_in_time(request.source, self._timeouts.validation_timeout)
                plan = self._refused(request, reason, ReasonCode.VALIDATION_TIMEOUT)
            else:
                return
            self._pending = None
            pipe = self._redis.pipeline(transaction=True)
            pipe.set(self._keys.dry_run_plan(request.id), plan.model_dump_json(), ex=DRY_RUN_TTL_S)
            pipe.delete(self._keys.dry_run(request.id))
            pipe.execute()
            log.info("dry run answered", request_id=request.id, query=request.source.name, valid=plan.valid)

    def _next_request(self) -> DryRunRequest | None:
        while True:
            raw_id = self._redis.rpop(self._keys.dry_runs)
            if raw_id is None:
                return None
            request_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            raw = self._redis.get(self._keys.dry_run(request_id))
            if raw is not None:  # else expired: nobody waits for it any more
                return DryRunRequest.model_validate_json(raw)

    def _outcome(self, request: DryRunRequest, work: Future[DryRunPlan]) -> DryRunPlan:
        try:
            return work.result()
        except BaseException as exc:  # noqa: BLE001 - user code (sys.exit() too) must not stop the executor
            return self._refused(request, *rejection(request.source, exc))

    @staticmethod
    def _refused(request: DryRunRequest, reason: str, code: ReasonCode) -> DryRunPlan:
        return DryRunPlan(
            request_id=request.id, query=request.source.name, valid=False, reason=reason, reason_code=code
        )

    def plan(self, request: DryRunRequest) -> DryRunPlan:
        """What a submit of the query would do now (run on the dry run's worker thread): admission's
        analysis against the query it would replace when its turn came, and the cut taken now."""
        swaps = Journal(self._redis, self._keys).all()
        current = read_current(self._redis, self._keys)
        basis = basis_for(swaps, current.query_id if current else None, self._graph, self._graphs.namespace_source)
        service = read_service_state(self._redis, self._keys)
        lateness = self._pipeline.lateness.ms
        base = DryRunPlan(
            request_id=request.id,
            query=request.source.name,
            valid=False,
            replaces=basis.query_id,
            replaces_window_ms=basis.windows.size_ms if basis.windows else None,
            lateness_ms=lateness,
            service_watermark=service.watermark,
            ahead=tuple(s.id for s in swaps if not s.state.is_terminal),
        )
        analysed = self._analyser.analyse(request.source, basis)
        if analysed.reads is not None:
            # The `events` a deployed graph of this version would read, on a topic that is never read.
            try:
                stream = events_stream(
                    self._spark,
                    self._pipeline,
                    self._kafka,
                    self._pipeline.names.graph_topic("validation"),
                    analysed.reads,
                )
                base = base.changed(schema_ddl=schema_ddl(stream.schema))
            except Exception as exc:  # noqa: BLE001 - said as a rejection: nothing here may stop the executor
                reason, code = rejection(request.source, exc)
                return base.changed(reason=reason, reason_code=code)
        refused = analysed.rejection
        if refused is not None:
            reason, code = refused
            return base.changed(reason=reason, reason_code=code)
        shape = analysed.shape
        assert shape is not None
        cut = None
        if service.max_window_end is not None and basis.windows is not None:
            cut = cut_boundary(service.max_window_end, basis.windows, shape.windowing, service.watermark)
        return base.changed(
            valid=True,
            window_ms=shape.window_ms,
            slide_ms=shape.windowing.slide_ms if shape.windowing.sliding else None,
            group_columns=shape.group_columns,
            columns=shape.columns,
            cut_window_end=cut,
            floor=None if cut is None else cut + lateness,
        )

    def _graph(self, query_id: str) -> GraphRecord | None:
        return read_graphs_named(self._redis, self._keys, [query_id]).get(query_id)
