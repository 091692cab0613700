"""Admission: submitted swaps are validated in submission order, each against the query it will
replace (the target of the swap queued just before it, or the current query), and given a unique
query id and a graph record, written in the same write as `validated`. A rejected query changes
nothing."""

from __future__ import annotations

import structlog

from hotswap.contract.errors import HotswapError
from hotswap.contract.faults import crash_point
from hotswap.contract.journal import Also, Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, new_spark_query_id
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.graph import GraphRunner
from hotswap.execution_graph.user_query import first_line
from hotswap.executor.control.graphs import Graphs

log = structlog.get_logger(__name__)


class Admission:
    def __init__(self, settings: Settings, journal: Journal, graphs: Graphs) -> None:
        self._settings = settings
        self._journal = journal
        self._graphs = graphs

    def admit_submitted(self) -> list[SwapRecord]:
        """Validate every submitted swap, in order; returns the open swaps as they are afterwards."""
        swaps = self._journal.open()
        for i, swap in enumerate(swaps):
            if swap.state is SwapPhase.SUBMITTED:
                # Each swap is checked against the one queued just before it, which may have been
                # validated (given its window size) a moment ago: `swaps` holds it as it is now.
                swaps[i] = self._validate(swap, swaps) or self._journal.get(swap.id)
        return [s for s in swaps if not s.state.is_terminal]

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
                query_id, grid_ms = earlier.to_query, earlier.new_slide_ms or earlier.new_window_ms
        if grid_ms is None and query_id is not None:
            record = self._graphs.get(query_id)
            grid_ms = record.windowing.grid_ms if record else None
        return query_id, grid_ms

    def _reject(self, swap: SwapRecord, reason: str, code: ReasonCode) -> SwapRecord | None:
        log.info("swap rejected", swap_id=swap.id, reason=reason, reason_code=code)
        return self._journal.advance(
            swap, SwapPhase.REJECTED, error=reason, reason_code=code, when=lambda r: r.state is SwapPhase.SUBMITTED
        )

    def _validate(self, swap: SwapRecord, swaps: list[SwapRecord]) -> SwapRecord | None:
        bound = log.bind(swap_id=swap.id)
        if swap.source is None:
            return self._reject(swap, "swap carries no query", ReasonCode.NO_QUERY)
        from_query, old_grid = self._predecessor(swap, swaps)
        predecessor = self._graphs.get(from_query) if from_query else None
        try:
            # The schema it reads: its own, if it declares one, else the one of the query it replaces.
            base = GraphRunner.reads(predecessor) if predecessor else self._graphs.namespace_source
            reads = self._graphs.version_reads(swap.source, base)
            shape = self._graphs.validate(swap.source, old_grid, reads)
        except QueryRejected as exc:
            return self._reject(swap, str(exc), exc.reason_code)
        except HotswapError as exc:
            return self._reject(swap, str(exc), ReasonCode.QUERY_INVALID)
        except Exception as exc:  # noqa: BLE001 - validation runs user code; nothing in it may stop the executor
            reason = f"query {swap.source.name!r} could not be validated: {type(exc).__name__}: {first_line(exc)}"
            bound.warning("validation raised", reason=reason)
            return self._reject(swap, reason, ReasonCode.QUERY_RAISED)
        taken = {s.to_query for s in swaps if s.id != swap.id and s.state.is_in_flight}
        query_id = self._graphs.unique_id(swap.to_query, taken)
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
            bound.info("swap validated", to_query=query_id, from_query=from_query, windows=shape.windowing.describe())
        return updated
