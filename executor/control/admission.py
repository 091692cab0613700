"""Admission: submitted swaps are validated in submission order, each against the query it will
replace (the target of the swap queued just before it, or the current query), and given a unique
query id and a graph record, written in the same write as `validated`. A rejected query changes
nothing.

Validation analyses the user's query over Spark (its code runs, Spark resolves the plan), which
takes seconds on a busy machine, so it never runs on the executor's loop: the loop starts the
analysis of the first submitted swap on a worker thread, one analysis at a time, and on later
steps looks, without waiting, whether it is done. Only then does the loop decide and write
`validated` or `rejected`: every journal write stays on the loop, and the next submitted swap is
analysed only once the one before it is decided (it is checked against that one). A result whose
swap was aborted meanwhile, or whose predecessor changed, is dropped (and analysed again if the swap
still waits). A crash mid-analysis leaves the swap `submitted`: a restarted executor analyses it
again.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass
from typing import TypeVar

import structlog

from hotswap.contract.causes import first_line
from hotswap.contract.errors import HotswapError
from hotswap.contract.faults import crash_point
from hotswap.contract.journal import Also, Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, QuerySource, new_spark_query_id
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.contract.source import SourceSpec
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.validation import QueryShape
from hotswap.executor.control.graphs import Graphs

log = structlog.get_logger(__name__)

T = TypeVar("T")

# How long a stopping executor lets an analysis in progress finish before it abandons it (Spark's
# analysis cannot be cancelled; its thread is a daemon and its result is dropped).
ABANDON_AFTER_S = 1.0


def on_own_thread(work: Callable[[], T], name: str) -> Future[T]:
    """Run `work` on a daemon thread of its own (with the caller's logging context); its future
    holds the result or what it raised. A daemon, so an analysis that never ends cannot hold up the
    executor's exit."""
    future: Future[T] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 - user code may raise anything: the loop decides what it means
            future.set_exception(exc)
        else:
            future.set_result(result)

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(run,), name=name, daemon=True).start()
    return future


@dataclass(frozen=True)
class Basis:
    """What a swap is validated against: the query it will replace, the spacing of that query's
    window ends, and the source as that query reads it."""

    query_id: str | None
    grid_ms: int | None
    reads: SourceSpec


@dataclass(frozen=True)
class Analysed:
    """What the analysis of a query found: how its version reads the source and the query's shape,
    or what the analysis raised; and how long it took."""

    reads: SourceSpec | None
    shape: QueryShape | None
    error: BaseException | None
    seconds: float


Worker = Callable[[Callable[[], Analysed], str], Future[Analysed]]


@dataclass(frozen=True)
class Analysis:
    """The analysis in progress (or done, not yet decided) of one submitted swap."""

    swap_id: str
    basis: Basis
    future: Future[Analysed]
    started_s: float  # on the admission's clock


class Admission:
    def __init__(
        self,
        settings: Settings,
        journal: Journal,
        graphs: Graphs,
        worker: Worker = on_own_thread,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._journal = journal
        self._graphs = graphs
        self._worker = worker  # where analyses run (tests may run them at once, on the caller's thread)
        self._clock = clock
        self._analysis: Analysis | None = None

    def admit_submitted(self) -> list[SwapRecord]:
        """Decide the submitted swaps whose analysis is done, in order, starting the analysis of the
        next one; never waits for one. Returns the open swaps as they are afterwards."""
        swaps = self._journal.open()
        for i, swap in enumerate(swaps):
            if swap.state is not SwapPhase.SUBMITTED:
                continue
            # Each swap is checked against the one queued just before it, which may have been
            # validated (given its window size) a moment ago: `swaps` holds it as it is now.
            decided = self._admit(swap, swaps)
            if decided is None or decided.state is SwapPhase.SUBMITTED:
                break  # its analysis runs (or its decision was not written): the swaps after it wait
            swaps[i] = decided
        else:
            self._drop_stale()
        return [s for s in swaps if not s.state.is_terminal]

    def close(self, wait_s: float = ABANDON_AFTER_S) -> None:
        """The executor stops: let an analysis in progress finish for at most `wait_s`, then abandon
        it (its swap stays `submitted`, and is analysed again by the next executor)."""
        analysis, self._analysis = self._analysis, None
        if analysis is None:
            return
        done, _ = wait_for_futures([analysis.future], timeout=wait_s)
        if not done:
            log.info("validation abandoned: the executor stops", swap_id=analysis.swap_id)

    def _admit(self, swap: SwapRecord, swaps: list[SwapRecord]) -> SwapRecord | None:
        """The swap as it is once decided, or None while its analysis runs."""
        if swap.source is None:
            return self._reject(swap, "swap carries no query", ReasonCode.NO_QUERY) or self._journal.get(swap.id)
        while True:
            analysis = self._analysis
            if analysis is None:
                analysis = self._analysis = self._start(swap, swap.source, self._basis(swap, swaps))
            if not analysis.future.done():
                if analysis.swap_id != swap.id or analysis.basis != self._basis(swap, swaps):
                    # Of a swap aborted meanwhile, or against a query that changed: abandoned now, so
                    # an analysis that never ends cannot hold up the queue.
                    self._analysis = None
                    log.info(
                        "validation abandoned: its swap or the query it replaces changed", swap_id=analysis.swap_id
                    )
                    continue
                waited = self._clock() - analysis.started_s
                if waited <= self._settings.validation_timeout.s:
                    return None
                self._analysis = None  # its thread is abandoned: Spark's analysis cannot be cancelled
                reason = (
                    f"query {swap.source.name!r} was not validated within {self._settings.validation_timeout} "
                    "(validation_timeout): its analysis (or its Python code) does not end; nothing changed"
                )
                return self._reject(swap, reason, ReasonCode.VALIDATION_TIMEOUT, waited) or self._journal.get(swap.id)
            # Checked again now: the swap before it may have been aborted, or failed, meanwhile.
            if analysis.swap_id == swap.id and analysis.basis == self._basis(swap, swaps):
                decided = self._decide(swap, swaps, analysis)
                self._analysis = None  # kept until then: a failed write is retried next step, not re-analysed
                return decided or self._journal.get(swap.id)
            self._analysis = None
            log.info(
                "validation result dropped: its swap or the query it replaces changed meanwhile",
                swap_id=analysis.swap_id,
                next_swap_id=swap.id,
            )

    def _drop_stale(self) -> None:
        """No swap is submitted: an analysis left is of a swap aborted meanwhile; dropped, done or not
        (a thread still analysing is abandoned)."""
        analysis, self._analysis = self._analysis, None
        if analysis is not None:
            log.info("validation dropped: its swap is no longer submitted", swap_id=analysis.swap_id)

    def _start(self, swap: SwapRecord, source: QuerySource, basis: Basis) -> Analysis:
        graphs = self._graphs

        def analyse() -> Analysed:
            began = time.monotonic()
            try:
                # The schema it reads: its own, if it declares one, else the one of the query it replaces.
                reads = graphs.version_reads(source, basis.reads)
                shape = graphs.validate(source, basis.grid_ms, reads)
            except BaseException as exc:  # noqa: BLE001 - user code runs here; the loop classifies what it raised
                return Analysed(None, None, exc, time.monotonic() - began)
            return Analysed(reads, shape, None, time.monotonic() - began)

        log.debug("validation started", swap_id=swap.id, against=basis.query_id)
        return Analysis(swap.id, basis, self._worker(analyse, f"hotswap-validate-{swap.id}"), self._clock())

    def _basis(self, swap: SwapRecord, swaps: list[SwapRecord]) -> Basis:
        from_query, grid_ms = self._predecessor(swap, swaps)
        predecessor = self._graphs.get(from_query) if from_query else None
        reads = predecessor.reads if predecessor else self._graphs.namespace_source
        return Basis(from_query, grid_ms, reads)

    def _predecessor(self, swap: SwapRecord, swaps: list[SwapRecord]) -> tuple[str | None, int | None]:
        """The query this swap will replace, and the spacing of its window ends (its slide; its size
        when tumbling): the target of the last swap queued before it, or the current query."""
        current = self._graphs.current()
        query_id = current.query_id if current else None
        grid_ms = None
        for earlier in swaps:
            if earlier.id == swap.id:
                break
            if earlier.state.is_in_flight:
                query_id, grid_ms = earlier.to_query, earlier.new_slide_ms
        if grid_ms is None and query_id is not None:
            record = self._graphs.get(query_id)
            grid_ms = record.windowing.grid_ms if record else None
        return query_id, grid_ms

    def _reject(
        self, swap: SwapRecord, reason: str, code: ReasonCode, validate_s: float | None = None
    ) -> SwapRecord | None:
        fields = {} if validate_s is None else {"validate_s": round(validate_s, 3)}
        log.info("swap rejected", swap_id=swap.id, reason=reason, reason_code=code, **fields)
        return self._journal.advance(
            swap, SwapPhase.REJECTED, error=reason, reason_code=code, when=lambda r: r.state is SwapPhase.SUBMITTED
        )

    def _decide(self, swap: SwapRecord, swaps: list[SwapRecord], analysis: Analysis) -> SwapRecord | None:
        bound = log.bind(swap_id=swap.id)
        assert swap.source is not None
        try:
            analysed = analysis.future.result()
        except BaseException as failure:  # noqa: BLE001 - the worker itself failed: decided like a raise in the analysis
            analysed = Analysed(None, None, failure, 0.0)
        seconds, exc = analysed.seconds, analysed.error
        if isinstance(exc, QueryRejected):
            return self._reject(swap, str(exc), exc.reason_code, seconds)
        if isinstance(exc, HotswapError):
            return self._reject(swap, str(exc), ReasonCode.QUERY_INVALID, seconds)
        if exc is not None:  # validation runs user code: nothing it raises, sys.exit() included, stops the executor
            reason = f"query {swap.source.name!r} could not be validated: {type(exc).__name__}: {first_line(exc)}"
            bound.warning("validation raised", reason=reason)
            return self._reject(swap, reason, ReasonCode.QUERY_RAISED, seconds)
        reads, shape = analysed.reads, analysed.shape
        assert reads is not None
        assert shape is not None
        taken = {s.to_query for s in swaps if s.id != swap.id and s.state.is_in_flight}
        query_id = self._graphs.unique_id(swap.to_query, taken)
        engine, partitions = self._graphs.layout()
        record = GraphRecord(
            query_id=query_id,
            source=swap.source,
            window_ms=shape.window_ms,
            topic=self._settings.names.graph_topic(query_id),
            group_columns=shape.group_columns,
            spark_query_id=new_spark_query_id(),
            reads=reads,
            slide_ms=shape.windowing.slide_ms,
            shadow_results_topic=self._settings.names.shadow_results_topic(query_id) if swap.shadow else None,
            engine=engine,
            partitions=partitions,
        )
        # Not bound to `from_query` yet: that happens when its turn comes (SwapProtocol._start_turn).
        updated = self._journal.advance(
            swap,
            SwapPhase.VALIDATED,
            when=lambda r: r.state is SwapPhase.SUBMITTED,
            also=Also(graphs=[record]),
            to_query=query_id,
            new_window_ms=shape.window_ms,
            new_slide_ms=shape.windowing.slide_ms,
        )
        if updated is not None:
            crash_point("after:validated")
            bound.info(
                "swap validated",
                to_query=query_id,
                from_query=analysis.basis.query_id,
                windows=shape.windowing.describe(),
                validate_s=round(seconds, 3),
            )
        return updated
