"""Answering dry runs (`hotswap submit FILE --dry-run`): validate a query against the running one
and say what a submit would do now, changing nothing.

The CLI leaves a request in Redis (contract.plans); the executor's loop takes it, validates the
query on a worker thread (as admission does: the loop never waits for it, and validation_timeout
bounds it), and writes the plan back with a time-to-live. Nothing else is written: no journal
entry, no graph record, no topic.
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

from hotswap.contract.causes import first_line
from hotswap.contract.errors import HotswapError
from hotswap.contract.journal import Journal, SwapRecord
from hotswap.contract.models import GraphRecord
from hotswap.contract.names import Keys
from hotswap.contract.plans import DRY_RUN_TTL_S, DryRunPlan, DryRunRequest
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.records import read_current, read_graphs, read_service_state
from hotswap.contract.settings import Settings
from hotswap.contract.windows import Windowing, cut_boundary
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.graph import events_stream
from hotswap.executor.control.admission import on_own_thread
from hotswap.executor.control.graphs import Graphs

log = structlog.get_logger(__name__)

ANSWERED_PER_TICK = 2  # a burst of dry runs must not hold the loop for long


def schema_ddl(schema: T.StructType) -> str:
    """A schema as DDL: `key STRING, value DOUBLE, ts BIGINT, event_time TIMESTAMP`."""
    return ", ".join(f"{field.name} {field.dataType.simpleString().upper()}" for field in schema.fields)


def predecessor(
    swaps: list[SwapRecord], current: str | None, graphs: dict[str, GraphRecord]
) -> tuple[str | None, Windowing | None]:
    """The query a swap submitted now would replace when its turn came, and its windows: the
    target of the last swap in flight, or the current query."""
    query_id, windows = current, graphs[current].windowing if current in graphs else None
    for swap in swaps:
        if swap.state.is_in_flight:
            query_id = swap.to_query
            if query_id in graphs:
                windows = graphs[query_id].windowing
            elif swap.new_window_ms is not None:
                windows = Windowing.of(swap.new_window_ms, swap.new_slide_ms)
            else:
                windows = None
    return query_id, windows


class DryRuns:
    def __init__(
        self,
        settings: Settings,
        spark: SparkSession,
        client: redis.Redis,
        graphs: Graphs,
        worker: Callable[[Callable[[], DryRunPlan], str], Future[DryRunPlan]] = on_own_thread,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._spark = spark
        self._redis = client
        self._graphs = graphs
        self._keys = Keys(settings.namespace)
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
            elif self._clock() - started > self._settings.validation_timeout.s:
                plan = self._refused(
                    request,
                    f"query {request.source.name!r} was not validated within {self._settings.validation_timeout} "
                    "(validation_timeout): its analysis (or its Python code) does not end",
                    ReasonCode.VALIDATION_TIMEOUT,
                )
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
            reason = f"query {request.source.name!r} could not be validated: {type(exc).__name__}: {first_line(exc)}"
            return self._refused(request, reason, ReasonCode.QUERY_RAISED)

    @staticmethod
    def _refused(request: DryRunRequest, reason: str, code: ReasonCode) -> DryRunPlan:
        return DryRunPlan(
            request_id=request.id, query=request.source.name, valid=False, reason=reason, reason_code=code
        )

    def plan(self, request: DryRunRequest) -> DryRunPlan:
        swaps = Journal(self._redis, self._keys).all()
        graphs = read_graphs(self._redis, self._keys)
        current = read_current(self._redis, self._keys)
        replaces, old_windows = predecessor(swaps, current.query_id if current else None, graphs)
        service = read_service_state(self._redis, self._keys)
        lateness = self._settings.lateness.ms
        base = DryRunPlan(
            request_id=request.id,
            query=request.source.name,
            valid=False,
            replaces=replaces,
            replaces_window_ms=old_windows.size_ms if old_windows else None,
            lateness_ms=lateness,
            service_watermark=service.watermark,
            ahead=tuple(s.id for s in swaps if not s.state.is_terminal),
        )
        # The same `events` a deployed graph of this version would read, on a topic that is never read:
        # the schema the query declares, else the one of the query it would replace (as admission does).
        previous = graphs.get(replaces) if replaces else None
        try:
            reads = self._graphs.version_reads(
                request.source, previous.reads if previous else self._graphs.namespace_source
            )
            stream = events_stream(self._spark, self._settings, self._settings.names.graph_topic("validation"), reads)
            base = base.changed(schema_ddl=schema_ddl(stream.schema))
            shape = self._graphs.validate(request.source, old_windows.grid_ms if old_windows else None, reads)
        except QueryRejected as exc:
            return base.changed(reason=str(exc), reason_code=exc.reason_code)
        except HotswapError as exc:
            return base.changed(reason=str(exc), reason_code=ReasonCode.QUERY_INVALID)
        except Exception as exc:  # noqa: BLE001 - validation runs user code; nothing in it may stop the executor
            reason = f"query {request.source.name!r} could not be validated: {first_line(exc)}"
            return base.changed(reason=reason, reason_code=ReasonCode.QUERY_RAISED)
        cut = None
        if service.max_window_end is not None and old_windows is not None:
            cut = cut_boundary(service.max_window_end, old_windows, shape.windowing, service.watermark)
        return base.changed(
            valid=True,
            window_ms=shape.window_ms,
            slide_ms=shape.windowing.slide_ms if shape.windowing.sliding else None,
            group_columns=shape.group_columns,
            columns=shape.columns,
            cut_window_end=cut,
            floor=None if cut is None else cut + lateness,
        )
