"""The swap protocol, driven by the executor one step per loop.

Phases (see contract.journal): submitted -> validated -> deployed -> cut -> draining -> drained
-> retired -> completed. The executor validates, deploys, confirms the drain and retires; the
service graph takes the cut and writes the end-of-window markers, because both must happen at a
micro-batch boundary of its own query (or of a tick between batches). Swaps run one at a time,
in submission order (the order of the journal's list, which Redis appends to atomically): a
submit that arrives during a running swap is validated at once and queued. A queued swap is bound
to the query it replaces only when its turn comes: then the current query is its predecessor,
and the window sizes are checked again against it, so an earlier swap that was aborted or failed
never strands it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
import structlog

from hotswap.contract.errors import HotswapError
from hotswap.contract.faults import crash_point
from hotswap.contract.fence import Fence
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, GraphState
from hotswap.contract.names import Keys
from hotswap.contract.records import read_progress
from hotswap.contract.settings import Settings
from hotswap.contract.windows import Windowing, first_row_needed, format_duration_ms, reached_cut, window_start
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.validation import check_cuttable
from hotswap.executor.control.admission import Admission
from hotswap.executor.control.graphs import Graphs
from hotswap.executor.control.waits import clock, start_blocker
from hotswap.service_sink.progress import ProgressReporter

log = structlog.get_logger(__name__)


class SwapProtocol:
    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        graphs: Graphs,
        reporter: ProgressReporter,
        fence: Fence | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._clock = clock  # measures the wait for a cut (tests move it by hand)
        self._redis = client
        self._keys = Keys(settings.namespace)
        self._journal = Journal(client, self._keys, fence)
        self._graphs = graphs
        self._admission = Admission(settings, self._journal, graphs)
        self._reporter = reporter
        self._deployed_seen: dict[str, float] = {}
        self._waiting_logged: set[tuple[str, SwapPhase]] = set()

    def step(self) -> None:
        self._admission.admit_submitted()
        swaps = self._journal.all()
        active = next((s for s in swaps if s.state.is_in_flight), None)
        if active is not None:
            self._advance(active)
        self._clean_up(swaps)

    # -- the protocol ----------------------------------------------------------------------
    def _advance(self, swap: SwapRecord) -> None:
        bound = log.bind(swap_id=swap.id, query_id=swap.to_query)
        if swap.state is SwapPhase.VALIDATED:
            activated = self._activate(swap, bound)
            if activated is not None:
                self._deploy(activated, bound)
        elif swap.state is SwapPhase.DEPLOYED:
            self._await_cut(swap, bound)
        elif swap.state in (SwapPhase.CUT, SwapPhase.DRAINING):
            self._await_drain(swap, bound)
        elif swap.state is SwapPhase.DRAINED:
            self._journal.advance(swap.id, SwapPhase.RETIRED)
            crash_point("after:retired")
            self._retire(swap, bound)
        elif swap.state is SwapPhase.RETIRED:
            self._retire(swap, bound)

    def _activate(self, swap: SwapRecord, bound: structlog.typing.FilteringBoundLogger) -> SwapRecord | None:
        """Bind the swap whose turn has come to the query serving now, or say why it must wait."""
        blocker = start_blocker(self._graphs.current(), self._graphs.records(), self._journal.all(), swap)
        if blocker is not None:
            if (swap.id, SwapPhase.VALIDATED) not in self._waiting_logged:
                self._waiting_logged.add((swap.id, SwapPhase.VALIDATED))
                bound.warning("swap waits before it can start", reason=blocker)
            return None
        if swap.recovers is not None:
            return self._activate_recovery(swap, bound)
        current = self._graphs.current()
        old = self._graphs.get(current.query_id) if current else None
        if old is None or swap.new_window_ms is None:
            self._fail(swap, "no query is serving to be replaced; the namespace needs `hotswap run --query FILE`")
            return None
        if swap.from_query != old.query_id:
            new = Windowing.of(swap.new_window_ms, swap.new_slide_ms)
            try:
                check_cuttable(old.windowing.grid_ms, new.grid_ms, slides=old.windowing.sliding or new.sliding)
            except QueryRejected as exc:
                self._fail(swap, f"{exc} (checked against {old.query_id}, which serves now)")
                return None
            bound.info("swap starts", from_query=old.query_id)
            return self._journal.update(
                swap.id, from_query=old.query_id, old_window_ms=old.window_ms, old_slide_ms=old.windowing.slide_ms
            )
        return swap

    def _activate_recovery(self, swap: SwapRecord, bound: structlog.typing.FilteringBoundLogger) -> SwapRecord | None:
        """A recovery takes over the failed query's topic from where it stopped: the end of the
        last window it emitted (its committed watermark, on its window grid), or the cut W."""
        assert swap.recovers is not None
        failed = self._journal.get(swap.recovers)
        dead = self._graphs.get(failed.to_query)
        record = self._graphs.get(swap.to_query)
        if failed.cut_window_end is None or dead is None or record is None or swap.new_window_ms is None:
            self._fail(swap, f"swap {swap.recovers} has no cut or no graph to take over; nothing to recover")
            return None
        if swap.from_query == dead.query_id and record.start_after is not None:
            return swap  # bound before a restart
        current = self._graphs.current()
        serving = current is not None and current.query_id == dead.query_id
        if dead.state is not GraphState.FAILED or not serving:
            self._fail(
                swap,
                f"query {dead.query_id} is {dead.state}{'' if serving else ' and no longer serves'}, so there is "
                "nothing to take over; submit the query without --fix, or `hotswap rollback` the swap that serves now",
            )
            return None
        self._graphs.runner.stop(dead.query_id)  # it must not emit another window once its successor starts
        dead_windows = dead.windowing
        new = Windowing.of(swap.new_window_ms, swap.new_slide_ms)
        # The last window end it emitted, on its grid (window ends are multiples of the slide).
        stopped_at = max(failed.cut_window_end, window_start(self._emitted_through(dead), dead_windows.grid_ms))
        if stopped_at % new.grid_ms:
            self._fail(
                swap,
                f"{dead.query_id} emitted its windows through {clock(stopped_at)}, which is not a boundary of "
                f"{new.describe()} windows; use a window size (or slide) that divides "
                f"{format_duration_ms(dead_windows.grid_ms)}",
            )
            return None
        # A sliding replacement's first window after that point starts size - slide before it; the
        # buffer holds the rows the failed query received, from its own first window after its cut.
        buffer_from = first_row_needed(failed.cut_window_end, dead_windows)
        if first_row_needed(stopped_at, new) < buffer_from:
            self._fail(
                swap,
                f"{new.describe()} windows ending after {clock(stopped_at)} need rows from "
                f"{clock(first_row_needed(stopped_at, new))}, but the buffer of {dead.query_id} starts at "
                f"{clock(buffer_from)}; use windows whose size minus slide is at most "
                f"{format_duration_ms(stopped_at - buffer_from)}",
            )
            return None
        # Written before the deploy that uses them: the graph reads the failed graph's topic from there.
        self._graphs.save(record.changed(topic=dead.topic, start_after=stopped_at))
        bound.info("recovery starts", failed_query=dead.query_id, from_window_end=stopped_at)
        return self._journal.update(
            swap.id, from_query=dead.query_id, old_window_ms=dead.window_ms, old_slide_ms=dead_windows.slide_ms
        )

    def _deploy(self, swap: SwapRecord, bound: structlog.typing.FilteringBoundLogger) -> None:
        record = self._graphs.get(swap.to_query)
        if record is None:
            self._fail(swap, f"graph {swap.to_query} has no record; resubmit the query")
            return
        bound.info("deploying new graph", topic=record.topic)
        try:
            self._graphs.deploy(record)
        except HotswapError as exc:
            self._fail(swap, f"{exc}; the old query keeps serving")
            return
        if self._journal.advance(swap.id, SwapPhase.DEPLOYED, when=lambda r: r.state is SwapPhase.VALIDATED):
            crash_point("after:deployed")
            bound.info("new graph deployed; waiting for the cut")

    def _emitted_through(self, graph: GraphRecord) -> int:
        """The watermark of the graph's last committed batch: as the sink reported it, or as its
        checkpoint says (a commit the reporter had not confirmed before an executor restart)."""
        progress = read_progress(self._redis, self._keys, graph.query_id)
        reported = progress.committed_watermark if progress and progress.committed_watermark else 0
        return max(reported, self._graphs.runner.last_commit_watermark(graph.query_id) or 0)

    def _await_cut(self, swap: SwapRecord, bound: structlog.typing.FilteringBoundLogger) -> None:
        failure = self._graphs.runner.failure(swap.to_query)
        if failure is not None:
            self._fail(swap, f"new query {swap.to_query} failed before the cut: {failure}; the old query keeps serving")
            return
        if swap.recovers is not None:
            # Its cut was decided at activation, where the failed query stopped (the graph's start_after).
            record = self._graphs.get(swap.to_query)
            stopped_at = record.start_after if record else None
            cut = self._journal.advance(
                swap.id, SwapPhase.CUT, when=lambda r: r.state is SwapPhase.DEPLOYED, cut_window_end=stopped_at
            )
            if cut is not None:
                bound.info("recovery cut recorded", cut_window_end=stopped_at)
            return
        seen = self._deployed_seen.setdefault(swap.id, self._clock())
        if self._clock() - seen > self._settings.drain_timeout_s:
            self._fail(
                swap,
                f"no cut within {self._settings.drain_timeout}: the service graph routed no batch; "
                f"check that events reach topic {self._settings.source_topic}, then resubmit",
            )

    def _await_drain(self, swap: SwapRecord, bound: structlog.typing.FilteringBoundLogger) -> None:
        if swap.recovers is not None:
            # The query it replaces is dead: it has nothing more to emit.
            if swap.state is SwapPhase.CUT:
                self._journal.advance(swap.id, SwapPhase.DRAINING)
            self._journal.advance(swap.id, SwapPhase.DRAINED)
            return
        if swap.state is not SwapPhase.DRAINING or swap.from_query is None or swap.cut_window_end is None:
            return
        progress = read_progress(self._redis, self._keys, swap.from_query)
        if reached_cut(progress.committed_watermark if progress else None, swap.cut_window_end):
            self._journal.advance(swap.id, SwapPhase.DRAINED)
            crash_point("after:drained")
            bound.info("old graph drained", from_query=swap.from_query, cut_window_end=swap.cut_window_end)
        elif (swap.id, swap.state) not in self._waiting_logged:
            self._waiting_logged.add((swap.id, swap.state))
            bound.info("waiting for the old graph to emit its last windows", from_query=swap.from_query)

    def _retire(self, swap: SwapRecord, bound: structlog.typing.FilteringBoundLogger) -> None:
        if swap.from_query is not None:
            self._graphs.retire(swap.from_query)
            self._reporter.forget(swap.from_query)
        new = self._graphs.get(swap.to_query)
        if new is not None:
            self._graphs.set_current(new)
        completed = self._journal.advance(swap.id, SwapPhase.COMPLETED)
        bound.info("swap completed", from_query=swap.from_query, cut_window_end=swap.cut_window_end)
        if completed is not None and completed.rollback_of is not None:
            self._mark_rolled_back(completed, self._journal.all())  # in the same step: no window without it

    def _mark_rolled_back(self, rollback: SwapRecord, swaps: list[SwapRecord]) -> None:
        """The swap a completed rollback undid ends `rolled_back` (done here, every step, so a crash
        between the two writes is finished by the next executor)."""
        assert rollback.rollback_of is not None
        target = next((s for s in swaps if s.id == rollback.rollback_of), None)
        if target is None or not (target.state is SwapPhase.COMPLETED or target.failed_after_cut):
            return  # already recorded (or nothing to record): no write on every step
        undone = self._journal.advance(
            rollback.rollback_of,
            SwapPhase.ROLLED_BACK,
            when=lambda r: r.state is SwapPhase.COMPLETED or r.failed_after_cut,
        )
        if undone is not None:
            log.info("swap rolled back", swap_id=undone.id, by=rollback.id, from_cut=rollback.cut_window_end)

    def _retire_drained_old_graph(self, swap: SwapRecord) -> None:
        """After a swap failed past its cut, the old graph is still retired once it has drained."""
        assert swap.from_query is not None
        assert swap.cut_window_end is not None
        old = self._graphs.get(swap.from_query)
        if old is None or old.state is not GraphState.RUNNING:
            return
        progress = read_progress(self._redis, self._keys, swap.from_query)
        if reached_cut(progress.committed_watermark if progress else None, swap.cut_window_end):
            self._graphs.retire(swap.from_query)
            self._reporter.forget(swap.from_query)

    def _fail(self, swap: SwapRecord, reason: str) -> None:
        failed = self._journal.advance(
            swap.id, SwapPhase.FAILED, error=reason, when=lambda r: r.state.is_before_cut and r.state.is_in_flight
        )
        if failed is not None:
            log.warning("swap failed", swap_id=swap.id, reason=reason)
            self._graphs.discard(swap.to_query)

    def graphs_failed(self, failed: list[tuple[GraphRecord, str]]) -> None:
        """Graphs that stayed dead after their restarts. Before a cut a failing new query already
        failed its swap; here the cut has happened, so routing keeps W: the new graph's rows wait
        in its topic and the old graph keeps its windows up to W."""
        swaps = self._journal.all()
        for record, reason in failed:
            deployed_by = next((s.id for s in reversed(swaps) if s.to_query == record.query_id), None)
            way_out = (
                f"`hotswap rollback {deployed_by}` or `hotswap submit FILE --fix {deployed_by}` takes it over"
                if deployed_by is not None
                else "fix the cause, then restart `hotswap run` to resume it from its checkpoint"
            )
            message = (
                f"query {record.query_id} kept failing after {self._settings.query_restarts} restarts ({reason}); "
                f"its input waits in topic {record.topic}: {way_out}"
            )
            swap = next(
                (s for s in swaps if s.state.is_draining and record.query_id in (s.from_query, s.to_query)),
                None,
            )
            if swap is None:
                log.error("query failed", query_id=record.query_id, error=message)
                continue
            new = self._graphs.get(swap.to_query)
            if new is not None:
                self._graphs.set_current(new)
            self._journal.advance(swap.id, SwapPhase.FAILED, error=message)
            log.error("swap failed after its cut", swap_id=swap.id, query_id=record.query_id, error=message)

    def _clean_up(self, swaps: list[SwapRecord]) -> None:
        """Record rollbacks that completed, and stop graphs whose swap ended before the cut (aborted
        or failed)."""
        current = self._graphs.current()
        for swap in swaps:
            if swap.rollback_of is not None and swap.state is SwapPhase.COMPLETED:
                self._mark_rolled_back(swap, swaps)
            if swap.state is SwapPhase.FAILED and swap.cut_window_end is not None and swap.from_query:
                self._retire_drained_old_graph(swap)
                continue
            # Only a validated swap owns its graph (validation gives it a unique query id).
            if swap.state not in (SwapPhase.ABORTED, SwapPhase.FAILED) or swap.new_window_ms is None:
                continue
            if current is not None and current.query_id == swap.to_query:
                continue
            record = self._graphs.get(swap.to_query)
            if record is not None and record.state in (GraphState.STARTING, GraphState.RUNNING):
                log.info("removing graph of ended swap", swap_id=swap.id, query_id=swap.to_query, state=swap.state)
                self._graphs.discard(swap.to_query)
