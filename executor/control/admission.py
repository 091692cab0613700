"""Admission: submitted swaps are validated in submission order, each against the query it will
replace (the target of the swap queued just before it, or the current query), and given a unique
query id and a graph record. A rejected query changes nothing."""

from __future__ import annotations

import structlog

from hotswap.contract.errors import HotswapError
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, new_spark_query_id
from hotswap.contract.settings import Settings
from hotswap.execution_graph.graph import GraphRunner
from hotswap.execution_graph.user_query import first_line
from hotswap.executor.control.graphs import Graphs

log = structlog.get_logger(__name__)


class Admission:
    def __init__(self, settings: Settings, journal: Journal, graphs: Graphs) -> None:
        self._settings = settings
        self._journal = journal
        self._graphs = graphs

    def admit_submitted(self) -> None:
        for swap_id in [s.id for s in self._journal.all() if s.state is SwapPhase.SUBMITTED]:
            # Read again after each validation: a swap is checked against the one queued just
            # before it, which may have been validated (given its window size) a moment ago.
            swaps = self._journal.all()
            swap = next(s for s in swaps if s.id == swap_id)
            if swap.state is SwapPhase.SUBMITTED:
                self._validate(swap, swaps)

    def _predecessor(self, swap: SwapRecord, swaps: list[SwapRecord]) -> tuple[str | None, int | None]:
        """The query this swap will replace, and the spacing of its window ends (its slide; its size
        when tumbling): the target of the last swap queued before it, or the current query."""
        current = self._graphs.current()
        query_id = current.query_id if current else None
        for earlier in swaps:
            if earlier.id == swap.id:
                break
            if earlier.state.is_in_flight:
                query_id = earlier.to_query
        record = self._graphs.get(query_id) if query_id else None
        if record is None and query_id is not None:
            queued = next((s for s in swaps if s.to_query == query_id and s.new_window_ms), None)
            return query_id, (queued.new_slide_ms or queued.new_window_ms) if queued else None
        return query_id, record.windowing.grid_ms if record else None

    def _validate(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        bound = log.bind(swap_id=swap.id)
        if swap.source is None:
            self._journal.advance(swap.id, SwapPhase.REJECTED, error="swap carries no query")
            return
        from_query, old_grid = self._predecessor(swap, swaps)
        predecessor = self._graphs.get(from_query) if from_query else None
        try:
            # The schema it reads: its own, if it declares one, else the one of the query it replaces.
            base = GraphRunner.reads(predecessor) if predecessor else self._graphs.namespace_source
            reads = self._graphs.version_reads(swap.source, base)
            shape = self._graphs.validate(swap.source, old_grid, reads)
        except HotswapError as exc:
            bound.info("swap rejected", reason=str(exc))
            self._journal.advance(swap.id, SwapPhase.REJECTED, error=str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - validation runs user code; nothing in it may stop the executor
            reason = f"query {swap.source.name!r} could not be validated: {type(exc).__name__}: {first_line(exc)}"
            bound.warning("swap rejected", reason=reason)
            self._journal.advance(swap.id, SwapPhase.REJECTED, error=reason)
            return
        taken = {s.to_query for s in swaps if s.id != swap.id and s.state.is_in_flight}
        query_id = self._graphs.unique_id(swap.to_query, taken)
        # Not bound to `from_query` yet: that happens when its turn comes (SwapProtocol._activate).
        updated = self._journal.advance(
            swap.id,
            SwapPhase.VALIDATED,
            when=lambda r: r.state is SwapPhase.SUBMITTED,
            to_query=query_id,
            new_window_ms=shape.window_ms,
            new_slide_ms=shape.windowing.slide_ms,
        )
        if updated is not None:
            record = GraphRecord(
                query_id=query_id,
                source=swap.source,
                window_ms=shape.window_ms,
                topic=self._settings.names.graph_topic(query_id),
                group_columns=shape.group_columns,
                spark_query_id=new_spark_query_id(),
                reads=reads,
                slide_ms=shape.windowing.slide_ms,
            )
            self._graphs.save(record)
            bound.info("swap validated", to_query=query_id, from_query=from_query, windows=shape.windowing.describe())
