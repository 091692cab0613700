"""Admission: submitted swaps are validated in submission order, each against the query it will
replace (the target of the swap queued just before it, or the current query), and given a unique
query id and a graph record, written in the same write as `validated`. A rejected query changes
nothing.

There is one admission of a query, whoever asks: `Analyser.analyse(source, basis)` analyses it
against its basis (`basis_for`: the query it replaces, that query's windows, the source as it reads
it) and says why it is refused (`rejection`), and `Analyser.graph_record` is the record of a valid
one. A submit (a rollback, a fix forward or a replace are submits too) is analysed here, on a
worker thread; a dry run (dry_run.py) on its own worker thread; the namespace's first query by
the executor as it starts (controller.py), before its loop runs.

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
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import structlog

from hotswap.contract.causes import first_line
from hotswap.contract.durations import Duration
from hotswap.contract.errors import HotswapError
from hotswap.contract.faults import crash_point
from hotswap.contract.journal import Also, Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, QuerySource, new_spark_query_id
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import PipelineSettings, Timeouts
from hotswap.contract.source import SourceSpec
from hotswap.contract.windows import Windowing
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
    """What a query is analysed against: the query it will replace (None: none serves yet), that
    query's windows, and the source as that query reads it (the namespace's, when none serves)."""

    query_id: str | None
    windows: Windowing | None
    reads: SourceSpec

    @property
    def grid_ms(self) -> int | None:
        """The spacing of the replaced query's window ends (its slide; its size when tumbling)."""
        return None if self.windows is None else self.windows.grid_ms


def basis_for(
    ahead: Iterable[SwapRecord],
    current: str | None,
    graph: Callable[[str], GraphRecord | None],
    namespace_source: SourceSpec,
) -> Basis:
    """The basis of a query queued behind the swaps `ahead`: the query it will replace when its turn
    comes (the target of the last swap in flight among them, else the current query), with that
    query's windows (its graph's; a swap's as validated) and how it reads the source."""
    query_id, last = current, None
    for swap in ahead:
        if swap.state.is_in_flight:
            query_id, last = swap.to_query, swap
    record = graph(query_id) if query_id is not None else None
    if record is not None:
        windows: Windowing | None = record.windowing
    elif last is not None and last.new_window_ms is not None:
        windows = Windowing.of(last.new_window_ms, last.new_slide_ms)
    else:
        windows = None
    return Basis(query_id, windows, record.reads if record is not None else namespace_source)


def rejection(source: QuerySource, exc: BaseException) -> tuple[str, ReasonCode]:
    """Why a query whose analysis raised `exc` is refused, in one line, and its reason code."""
    if isinstance(exc, QueryRejected):
        return str(exc), exc.reason_code
    if isinstance(exc, HotswapError):
        return str(exc), ReasonCode.QUERY_INVALID
    # Validation runs user code: nothing it raises, sys.exit() included, is the executor's own failure.
    reason = f"query {source.name!r} could not be validated: {type(exc).__name__}: {first_line(exc)}"
    return reason, ReasonCode.QUERY_RAISED


def not_validated_in_time(source: QuerySource, timeout: Duration) -> str:
    """Why a query whose analysis outlasted validation_timeout is refused."""
    return (
        f"query {source.name!r} was not validated within {timeout} (validation_timeout): its analysis (or its "
        "Python code) does not end"
    )


@dataclass(frozen=True)
class Analysed:
    """What the analysis of a query against its basis found: how its version reads the source and
    the query's shape, or what the analysis raised; and how long it took."""

    source: QuerySource
    basis: Basis
    reads: SourceSpec | None
    shape: QueryShape | None
    error: BaseException | None
    seconds: float

    @property
    def rejection(self) -> tuple[str, ReasonCode] | None:
        """Why the query is refused (one line) and its reason code; None: it is valid."""
        return None if self.error is None else rejection(self.source, self.error)


class Analyser:
    """The one admission of a query (see the module's docstring). `analyse` runs the user's code and
    has Spark analyse it, which takes seconds: the executor's loop never runs it itself, but on a
    worker thread (a submit's, a dry run's)."""

    def __init__(self, pipeline: PipelineSettings, graphs: Graphs) -> None:
        self._names = pipeline.names
        self._graphs = graphs

    def analyse(self, source: QuerySource, basis: Basis) -> Analysed:
        """Analyse `source` against `basis`. Never raises: what the analysis raised is in the result."""
        began = time.monotonic()
        try:
            # The schema it reads: its own, if it declares one, else the one of the query it replaces.
            reads = self._graphs.version_reads(source, basis.reads)
        except BaseException as exc:  # noqa: BLE001 - the caller decides what it means
            return Analysed(source, basis, None, None, exc, time.monotonic() - began)
        try:
            shape = self._graphs.validate(source, basis.grid_ms, reads)
        except BaseException as exc:  # noqa: BLE001 - user code runs here; the caller classifies what it raised
            return Analysed(source, basis, reads, None, exc, time.monotonic() - began)
        return Analysed(source, basis, reads, shape, None, time.monotonic() - began)

    def graph_record(self, analysed: Analysed, query_id: str, *, shadow: bool = False) -> GraphRecord:
        """The record of a valid query's graph, under `query_id`, as a graph recorded now runs it."""
        reads, shape = analysed.reads, analysed.shape
        assert reads is not None
        assert shape is not None
        engine, partitions = self._graphs.layout()
        names = self._names
        return GraphRecord(
            query_id=query_id,
            source=analysed.source,
            window_ms=shape.window_ms,
            topic=names.graph_topic(query_id),
            group_columns=shape.group_columns,
            spark_query_id=new_spark_query_id(),
            reads=reads,
            slide_ms=shape.windowing.slide_ms,
            shadow_results_topic=names.shadow_results_topic(query_id) if shadow else None,
            engine=engine,
            partitions=partitions,
        )


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
        journal: Journal,
        graphs: Graphs,
        worker: Worker = on_own_thread,
        clock: Callable[[], float] = time.monotonic,
        *,
        pipeline: PipelineSettings,
        timeouts: Timeouts,
    ) -> None:
        self._timeouts = timeouts
        self._sink = pipeline.sink
        self._journal = journal
        self._graphs = graphs
        self._analyser = Analyser(pipeline, graphs)
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
        if swap.shadow and not self._sink.is_kafka:
            # A shadow's diff reads both versions' results from Kafka topics (service_sink.diff).
            reason = (
                f"a shadow needs a Kafka sink; this namespace writes its results to {self._sink}: "
                "submit without --shadow"
            )
            code = ReasonCode.SHADOW_NEEDS_KAFKA_SINK
            return self._reject(swap, reason, code) or self._journal.get(swap.id)
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
                if waited <= self._timeouts.validation_timeout.s:
                    return None
                self._analysis = None  # its thread is abandoned: Spark's analysis cannot be cancelled
                reason = f"{not_validated_in_time(swap.source, self._timeouts.validation_timeout)}; nothing changed"
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
        log.debug("validation started", swap_id=swap.id, against=basis.query_id)
        work = partial(self._analyser.analyse, source, basis)
        return Analysis(swap.id, basis, self._worker(work, f"hotswap-validate-{swap.id}"), self._clock())

    def _basis(self, swap: SwapRecord, swaps: list[SwapRecord]) -> Basis:
        """What `swap` is checked against: the query it will replace, as the swaps queued before it are now."""
        current = self._graphs.current()
        ahead = itertools.takewhile(lambda earlier: earlier.id != swap.id, swaps)
        return basis_for(ahead, current.query_id if current else None, self._graphs.get, self._graphs.namespace_source)

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
            analysed = Analysed(swap.source, analysis.basis, None, None, failure, 0.0)
        refused = analysed.rejection
        if refused is not None:
            reason, code = refused
            if not isinstance(analysed.error, HotswapError):
                bound.warning("validation raised", reason=reason)
            return self._reject(swap, reason, code, analysed.seconds)
        shape = analysed.shape
        assert shape is not None
        taken = {s.to_query for s in swaps if s.id != swap.id and s.state.is_in_flight}
        query_id = self._graphs.unique_id(swap.to_query, taken)
        record = self._analyser.graph_record(analysed, query_id, shadow=swap.shadow)
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
                validate_s=round(analysed.seconds, 3),
            )
        return updated
