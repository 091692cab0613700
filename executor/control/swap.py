"""The swap protocol, driven by the executor one step per loop.

The phases and their moves are the table in contract/phases.py. Each step the executor decides the
submitted swaps whose validation is done and starts the next one's (admission.py: the analysis runs
on a worker thread, the decision is written on the loop), then acts on the one active swap
(`active_swap`) through the handler of what that swap's phase waits for, when the phase table says
the executor moves the swap on from there (`driven_by`): one handler per wait, no second dispatch.
From a wait another driver moves on, the executor only watches (`watches`): before the cut, that the
new query still runs, and that the wait ends within its time (cut_timeout). The service graph's batch
takes the cut (or starts a shadow at S) and records `draining`, because each must happen at a
micro-batch boundary of its own query (or at a tick between batches); an operator promotes a shadow.

Every action follows the write that records it: `deploying` (with the graph record) before the new
query starts, `retiring` before the old query stops, `stranded` (with the current query) before
anything else changes after a failure past the cut. Nothing in a step blocks the loop: a validation
or a deploy starts on one step, and later steps check, without waiting, whether it is done
(`deploy_timeout` is measured on the monotonic clock across steps).

Swaps run one at a time, in submission order (the order of the journal's list, which Redis appends
to atomically): a submit that arrives during a running swap is validated while it runs, and queued. A
queued swap is bound to the query it replaces only when its turn comes: then the current query is
its predecessor, and the window sizes are checked again against it, so an earlier swap that was
aborted or failed never strands it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import structlog

from hotswap.contract.errors import HotswapError
from hotswap.contract.faults import crash_point
from hotswap.contract.fence import Fence
from hotswap.contract.journal import Also, Journal, SwapPhase, SwapRecord, active_swap
from hotswap.contract.models import CurrentQuery, GraphEngine, GraphRecord, GraphState, now_ms
from hotswap.contract.names import Keys
from hotswap.contract.phases import Driver, Wait, clock, driven_by
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import PipelineSettings, RecoverySettings, Timeouts
from hotswap.contract.windows import Windowing, first_row_needed, format_duration_ms, reached_cut, window_start
from hotswap.execution_graph.errors import GraphStartFailed, QueryRejected
from hotswap.execution_graph.validation import check_cuttable
from hotswap.executor.control.admission import Admission, Worker, on_own_thread
from hotswap.executor.control.graphs import Graphs
from hotswap.executor.control.recovery import rollback_swap
from hotswap.executor.control.waits import graphs_to_start, start_blocker

log = structlog.get_logger(__name__)


class Progress(Protocol):
    """The part of the service sink's ProgressReporter the protocol reads: how far a graph emitted."""

    def committed_through(self, query_id: str) -> int | None: ...

    def forget(self, query_id: str) -> None: ...


Handler = Callable[[SwapRecord, list[SwapRecord]], None]

_NO_CUT = (
    "no cut within {timeout} (cut_timeout): the service graph routed no batch; check that events reach topic "
    "{topic}, then resubmit"
)


@dataclass(frozen=True)
class Watch:
    """What the executor watches while another driver moves the active swap on. Before the cut, it
    fails the swap if its new query died, whatever the wait."""

    cut_timeout: str | None = None  # the swap fails with this error once the wait outlasts cut_timeout
    says: str | None = None  # logged once, when the executor first sees the swap wait there


class SwapProtocol:
    def __init__(
        self,
        client: redis.Redis,
        graphs: Graphs,
        progress: Progress,
        fence: Fence | None = None,
        clock: Callable[[], float] = time.monotonic,
        worker: Worker = on_own_thread,
        *,
        pipeline: PipelineSettings,
        timeouts: Timeouts,
        recovery: RecoverySettings,
    ) -> None:
        self._pipeline = pipeline
        self._timeouts = timeouts
        self._recovery = recovery
        self._clock = clock  # measures the deploy and the wait for a cut (tests move it by hand)
        self._keys = Keys(pipeline.names.namespace)
        self._journal = Journal(client, self._keys, fence)
        self._graphs = graphs
        self._admission = Admission(self._journal, graphs, worker, clock, pipeline=pipeline, timeouts=timeouts)
        self._progress = progress
        self._deploy_began: dict[str, float] = {}
        self._awaited: dict[str, dict[Wait, float]] = {}  # by swap: when the executor first saw each wait
        self._retire_began: dict[str, float] = {}
        self._said: set[tuple[str, SwapPhase]] = set()
        self._open_ids: set[str] = set()
        # Whether the active swap waits for its old graph's last windows: the executor then looks at
        # the graph's progress more often than once a tick (controller.DRAIN_TICK_S), since the swap's
        # end waits for that look and nothing else.
        self.awaiting_output = False
        # What the executor does for a swap that waits for what the executor moves on (the phase
        # table's driver): one handler per wait. (`validation`, before a swap is in flight, is admission's.)
        self.handlers: Mapping[Wait, Handler] = {
            Wait.TURN: self._start_turn,
            Wait.GRAPH_START: self._await_start,
            Wait.STOP_POINT: self._record_stop_point,
            Wait.NOTHING_TO_DRAIN: self._skip_drain,
            Wait.OLD_GRAPH_OUTPUT: self._await_old_output,
            Wait.RETIRE: self._retire_old,
            Wait.OLD_GRAPH_STOP: self._retire_old,
            Wait.COMPLETION: self._complete,
        }
        # What it watches while the service graph's batch or an operator moves the swap on.
        self.watches: Mapping[Wait, Watch] = {
            Wait.CUT: Watch(cut_timeout=_NO_CUT),
            Wait.SHADOW_START: Watch(cut_timeout=_NO_CUT),
            Wait.PROMOTION: Watch(),  # the shadow runs until an operator promotes or aborts it
            Wait.PROMOTED_CUT: Watch(cut_timeout=f"promoted, but {_NO_CUT}"),
            Wait.WATERMARK: Watch(says="waiting for the service watermark to pass W"),
        }

    def step(self) -> None:
        self.awaiting_output = False  # until this step says so (a step that raises leaves it off)
        swaps = self._admission.admit_submitted()
        active = active_swap(swaps)
        self._hold_to_error_budget(active)
        wait = None if active is None else driven_by(active, Driver.EXECUTOR)
        # Not for a drain that stalled (its old graph failed for good): that waits for an operator.
        stalled = active is not None and active.reason_code is ReasonCode.DRAIN_STALLED
        self.awaiting_output = wait is Wait.OLD_GRAPH_OUTPUT and not stalled
        if active is not None:
            if wait is not None:
                self.handlers[wait](active, swaps)
            else:
                self._watch(active)
        self._clean_up(swaps)

    def close(self) -> None:
        """The executor stops: a validation in progress is abandoned (its swap stays `submitted`)."""
        self._admission.close()

    def _hold_to_error_budget(self, active: SwapRecord | None) -> None:
        """An automatic rollback's error budget holds the new query of the active swap from its cut on."""
        allowed = self._recovery.rollback_failures
        if active is None or allowed is None or not (self._rolls_back_itself(active) and active.state.is_past_cut):
            self._graphs.hold_to_error_budgets({})
            return
        self._graphs.hold_to_error_budgets({active.to_query: (allowed, self._recovery.rollback_window.s)})

    def _log(self, swap: SwapRecord) -> structlog.typing.FilteringBoundLogger:
        return log.bind(swap_id=swap.id, query_id=swap.to_query)  # type: ignore[no-any-return]

    def _say_once(self, swap: SwapRecord, event: str, **fields: object) -> None:
        if (swap.id, swap.state) not in self._said:
            self._said.add((swap.id, swap.state))
            self._log(swap).info(event, **fields)

    # -- validated: its turn ----------------------------------------------------------------
    def _start_turn(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        """Bind the swap whose turn has come to the query it replaces, record it `deploying` with its
        graph record, then start the graph."""
        current = self._graphs.current()
        graphs = self._graphs.get_many(graphs_to_start(current, swaps))
        blocker = start_blocker(current, graphs, swaps, swap)
        if blocker is not None:
            if (swap.id, swap.state) not in self._said:
                self._said.add((swap.id, swap.state))
                self._log(swap).warning("swap waits before it can start", reason=blocker)
            return
        binding = self._bind_recovery(swap) if swap.is_recovery else self._bind(swap, current, graphs)
        if binding is None:
            return
        changes, graph = binding
        deploying = self._journal.advance(
            swap,
            SwapPhase.DEPLOYING,
            when=lambda r: r.state is SwapPhase.VALIDATED,
            also=Also(graphs=[graph]),
            **changes,
        )
        if deploying is None:
            return
        crash_point("after:deploying")
        self._log(deploying).info("deploying new graph", topic=graph.topic, from_query=deploying.from_query)
        self._begin(deploying, graph)

    def _bind(
        self, swap: SwapRecord, current: CurrentQuery | None, graphs: Mapping[str, GraphRecord]
    ) -> tuple[dict[str, Any], GraphRecord] | None:
        old = graphs.get(current.query_id) if current else None
        if old is None or swap.new_window_ms is None:
            self._fail(
                swap,
                "no query is serving to be replaced; the namespace needs `hotswap run --query FILE`",
                ReasonCode.NOTHING_TO_REPLACE,
            )
            return None
        new = Windowing.of(swap.new_window_ms, swap.new_slide_ms)
        try:
            check_cuttable(old.windowing.grid_ms, new.grid_ms, slides=old.windowing.sliding or new.sliding)
        except QueryRejected as exc:
            self._fail(swap, f"{exc} (checked against {old.query_id}, which serves now)", exc.reason_code)
            return None
        graph = self._graphs.get(swap.to_query)
        if graph is None:
            self._fail(swap, f"graph {swap.to_query} has no record; resubmit the query", ReasonCode.GRAPH_NOT_RECORDED)
            return None
        changes = {"from_query": old.query_id, "old_window_ms": old.window_ms, "old_slide_ms": old.windowing.slide_ms}
        return changes, graph

    def _bind_recovery(self, swap: SwapRecord) -> tuple[dict[str, Any], GraphRecord] | None:
        """A recovery takes over the failed query's topic from where it stopped: the end of the
        last window it emitted (its committed watermark, on its window grid), or the cut W. A
        replacement of the namespace's first query (`replaces`) has no cut: its buffer is its
        whole topic."""
        taken = self._taken_over(swap)
        if taken is None:
            return None
        dead, cut = taken
        record = self._graphs.get(swap.to_query)
        if record is None or swap.new_window_ms is None:
            self._fail(swap, f"graph {swap.to_query} has no record; resubmit the query", ReasonCode.GRAPH_NOT_RECORDED)
            return None
        self._graphs.runner.stop(dead.query_id)  # it must not emit another window once its successor starts
        dead_windows = dead.windowing
        new = Windowing.of(swap.new_window_ms, swap.new_slide_ms)
        # The last window end it emitted, on its grid (window ends are multiples of the slide).
        emitted = self._progress.committed_through(dead.query_id) or 0
        stopped_at = max(cut or 0, window_start(emitted, dead_windows.grid_ms))
        if stopped_at % new.grid_ms:
            self._fail(
                swap,
                f"{dead.query_id} emitted its windows through {clock(stopped_at)}, which is not a boundary of "
                f"{new.describe()} windows; use a window size (or slide) that divides "
                f"{format_duration_ms(dead_windows.grid_ms)}",
                ReasonCode.RECOVERY_NOT_ALIGNED,
            )
            return None
        # A sliding replacement's first window after that point starts size - slide before it; the
        # buffer holds the rows the failed query received, from its own first window after its cut.
        buffer_from = None if cut is None else first_row_needed(cut, dead_windows)
        if buffer_from is not None and swap.recovers is not None:
            kept = self._journal.get(swap.recovers).buffer_from  # a swap that rolls back on its own kept more
            if kept is not None:
                buffer_from = min(buffer_from, kept)
        if buffer_from is not None and first_row_needed(stopped_at, new) < buffer_from:
            self._fail(
                swap,
                f"{new.describe()} windows ending after {clock(stopped_at)} need rows from "
                f"{clock(first_row_needed(stopped_at, new))}, but the buffer of {dead.query_id} starts at "
                f"{clock(buffer_from)}; use windows whose size minus slide is at most "
                f"{format_duration_ms(stopped_at - buffer_from)}",
                ReasonCode.RECOVERY_NOT_ALIGNED,
            )
            return None
        self._log(swap).info("recovery starts", failed_query=dead.query_id, from_window_end=stopped_at)
        # The graph reads the failed graph's topic from there: written with `deploying`, before it starts.
        # On the failed graph's topic, with its partitions (a topic of several needs the closing engine).
        engine = GraphEngine.CLOSING if dead.partitions > 1 else record.engine
        graph = record.changed(topic=dead.topic, start_after=stopped_at, partitions=dead.partitions, engine=engine)
        changes = {"from_query": dead.query_id, "old_window_ms": dead.window_ms, "old_slide_ms": dead_windows.slide_ms}
        return changes, graph

    def _taken_over(self, swap: SwapRecord) -> tuple[GraphRecord, int | None] | None:
        """The failed graph a recovery takes over, with the cut its buffer begins after (None: the
        namespace's first query, whose buffer is its whole topic); None (the swap failed) if there
        is nothing to take over."""
        current = self._graphs.current()
        if swap.recovers is not None:
            failed = self._journal.get(swap.recovers)
            dead = self._graphs.get(failed.to_query)
            serving = current is not None and dead is not None and current.query_id == dead.query_id
            takeable = failed.state.is_stranded or (failed.state is SwapPhase.COMPLETED and serving)
            what, cut = f"swap {failed.id} is {failed.state} and its query {failed.to_query}", failed.cut_window_end
            if cut is None:
                takeable = False
        else:
            assert swap.replaces is not None
            dead = self._graphs.get(swap.replaces)
            # Only a query no swap made current has its whole topic as its buffer; one a swap made
            # current is taken over by a fix of that swap, from its cut.
            made_by_swap = any(
                s.to_query == swap.replaces and (s.state.is_past_cut or s.state.is_done) for s in self._journal.all()
            )
            takeable = current is not None and current.query_id == swap.replaces and not made_by_swap
            what, cut = f"query {swap.replaces}, {'serving' if takeable else 'not serving'},", None
        if dead is None or dead.state is not GraphState.FAILED or not takeable:
            self._fail(
                swap,
                f"{what} is {dead.state if dead else 'unknown'}, so there is nothing to take over; submit the query "
                "without --fix, or `hotswap rollback` the swap that serves now",
                ReasonCode.NOTHING_TO_RECOVER,
            )
            return None
        return dead, cut

    # -- deploying: the new graph starts ----------------------------------------------------
    def _begin(self, swap: SwapRecord, graph: GraphRecord) -> bool:
        """Create the graph's topic and start its query; a refusal (a topic Kafka will not create:
        a quota, an ACL, a policy) fails the swap at once, as nothing was started and trying again on
        every tick would only repeat it. Returns whether the graph is starting."""
        self._deploy_began[swap.id] = self._clock()
        try:
            self._graphs.begin(graph)
        except HotswapError as exc:
            self._deploy_began.pop(swap.id, None)
            self._fail(swap, f"{exc}; the old query keeps serving", ReasonCode.DEPLOY_FAILED)
            return False
        return True

    def _await_start(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        if swap.to_query not in self._graphs.runner.known():
            # Recorded `deploying`, but not started by this executor (it restarted since): start it now.
            graph = self._graphs.get(swap.to_query)
            if graph is None:
                self._fail(
                    swap, f"graph {swap.to_query} has no record; resubmit the query", ReasonCode.GRAPH_NOT_RECORDED
                )
                return
            if not self._begin(swap, graph):
                return
        began = self._deploy_began.setdefault(swap.id, self._clock())
        try:
            ready = self._graphs.ready(swap.to_query)
        except GraphStartFailed as exc:
            self._fail(swap, f"{exc}; the old query keeps serving", ReasonCode.DEPLOY_FAILED)
            return
        if ready:
            crash_point("before:deployed")  # the new query runs; `deployed` is not written yet
            graph = self._graphs.get(swap.to_query)
            running = [graph.moved(GraphState.RUNNING)] if graph else []
            deployed = self._journal.advance(
                swap, SwapPhase.DEPLOYED, when=lambda r: r.state is SwapPhase.DEPLOYING, also=Also(graphs=running)
            )
            if deployed is not None:
                crash_point("after:deployed")
                self._log(swap).info(
                    "new graph deployed; waiting for the cut", deploy_s=round(self._clock() - began, 3)
                )
        elif self._clock() - began > self._timeouts.deploy_timeout.s:
            self._fail(
                swap,
                f"execution graph {swap.to_query} was not running after {self._timeouts.deploy_timeout} "
                "(deploy_timeout); the old query keeps serving",
                ReasonCode.DEPLOY_TIMEOUT,
            )

    # -- deployed: the cut ------------------------------------------------------------------
    def _failed_before_cut(self, swap: SwapRecord) -> bool:
        failure = self._graphs.runner.failure(swap.to_query)
        if failure is not None:
            self._fail(
                swap,
                f"new query {swap.to_query} failed before the cut: {failure}; the old query keeps serving",
                ReasonCode.QUERY_FAILED_BEFORE_CUT,
            )
        return failure is not None

    def _watch(self, swap: SwapRecord) -> None:
        """Another driver moves the swap on from what it waits for: the executor watches the new
        query before the cut, and the wait's time; a promoted shadow's cut, for one, comes at the
        service graph's next batch or tick, within cut_timeout."""
        wait = swap.wait
        assert wait is not None, swap.state
        if swap.state.is_before_cut and self._failed_before_cut(swap):
            return
        watch = self.watches[wait]
        if watch.says is not None:
            self._say_once(swap, watch.says, cut_window_end=swap.cut_window_end)
        if watch.cut_timeout is None:
            return
        waited = self._clock() - self._awaited.setdefault(swap.id, {}).setdefault(wait, self._clock())
        if waited > self._timeouts.cut_timeout.s:
            error = watch.cut_timeout.format(timeout=self._timeouts.cut_timeout, topic=self._pipeline.source_topic)
            self._fail(swap, error, ReasonCode.CUT_TIMEOUT)

    def _record_stop_point(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        """A recovery's cut is where the failed query stopped, decided when it was bound (the graph's
        start_after): the executor records it."""
        if self._failed_before_cut(swap):
            return
        graph = self._graphs.get(swap.to_query)
        stopped_at = graph.start_after if graph else None
        cut = self._journal.advance(
            swap, SwapPhase.CUT, when=lambda r: r.state is SwapPhase.DEPLOYED, cut_window_end=stopped_at
        )
        if cut is not None:
            self._log(swap).info("recovery cut recorded", cut_window_end=stopped_at)

    # -- cut, draining: the old graph emits its last windows --------------------------------
    def _skip_drain(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        """A recovery replaces a dead query: it has nothing more to emit."""
        if swap.state is SwapPhase.CUT:
            moved = self._journal.advance(swap, SwapPhase.DRAINING, when=lambda r: r.state is SwapPhase.CUT)
            if moved is None:
                return
            swap = moved
        self._journal.advance(swap, SwapPhase.DRAINED, when=lambda r: r.state is SwapPhase.DRAINING)

    def _await_old_output(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        if swap.from_query is None or swap.cut_window_end is None:
            return
        if reached_cut(self._progress.committed_through(swap.from_query), swap.cut_window_end):
            if swap.reason_code is ReasonCode.DRAIN_STALLED:  # it stalled, and was resumed since: over
                swap = self._journal.update(swap, error=None, reason_code=None) or swap
            drained = self._journal.advance(swap, SwapPhase.DRAINED, when=lambda r: r.state is SwapPhase.DRAINING)
            if drained is not None:
                crash_point("after:drained")
                self._log(swap).info(
                    "old graph drained", from_query=swap.from_query, cut_window_end=swap.cut_window_end
                )
                self._retire_old(drained, swaps)  # in the same step: a tick's wait would only add to the swap
        else:
            self._say_once(swap, "waiting for the old graph to emit its last windows", from_query=swap.from_query)

    # -- drained, retiring, retired: the old query stops, the new one becomes current -------
    def _retire_old(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        if swap.state is SwapPhase.DRAINED:
            retiring = self._journal.advance(swap, SwapPhase.RETIRING, when=lambda r: r.state is SwapPhase.DRAINED)
            if retiring is None:
                return
            crash_point("after:retiring")
            swap = retiring
        retired: list[GraphRecord] = []
        if swap.from_query is not None:
            if not self._old_query_stopped(swap, swap.from_query):
                return
            crash_point("after:old-stopped")  # stopped; `retired` not written yet
            old = self._graphs.get(swap.from_query)
            if old is not None and not old.state.is_ended:
                retired.append(old.moved(GraphState.RETIRED))
        done = self._journal.advance(
            swap, SwapPhase.RETIRED, when=lambda r: r.state is SwapPhase.RETIRING, also=Also(graphs=retired)
        )
        if done is not None:
            crash_point("after:retired")
            self._log(swap).info("old graph retired", from_query=swap.from_query)
            self._complete(done, swaps)  # in the same step: nothing is left to wait for

    def _old_query_stopped(self, swap: SwapRecord, query_id: str) -> bool:
        """Whether the retiring graph's query has stopped, or retire_timeout has passed: then it is
        retired anyway, since it has emitted every window it owns and the ownership filter drops
        anything it would still write; its stop goes on in the background."""
        began = self._retire_began.setdefault(swap.id, self._clock())
        if self._graphs.stop(query_id):
            return True
        if self._clock() - began <= self._timeouts.retire_timeout.s:
            self._say_once(swap, "waiting for the old query to stop", from_query=query_id)
            return False
        self._log(swap).warning(
            "old query did not stop within retire_timeout; retired anyway (it emitted every window it owns)",
            from_query=query_id,
            reason_code=ReasonCode.RETIRE_TIMEOUT,
        )
        return True

    def _complete(self, swap: SwapRecord, swaps: list[SwapRecord]) -> None:
        """Make the new graph current and the swap completed, and record the swap it undid or took
        over (rolled back, fixed forward), in one write: routing never sees one without the other."""
        if swap.from_query is not None:
            old = self._graphs.get(swap.from_query)
            if old is not None:
                self._graphs.remove_topic(old)
            self._progress.forget(swap.from_query)
        new = self._graphs.get(swap.to_query)
        current = CurrentQuery(query_id=swap.to_query, started_at=(new.started_at if new else None) or now_ms())
        completed = self._journal.advance(
            swap,
            SwapPhase.COMPLETED,
            when=lambda r: r.state is SwapPhase.RETIRED,
            also=Also(current=current, relabel=self._undone(swap)),
        )
        if completed is not None:
            self._log(swap).info("swap completed", from_query=swap.from_query, cut_window_end=swap.cut_window_end)
            if completed.rollback_of is not None:
                log.info("swap rolled back", swap_id=completed.rollback_of, by=completed.id)

    def _undone(self, swap: SwapRecord) -> tuple[str, SwapPhase] | None:
        """The swap this one rolls back or fixes forward, with the phase it ends in, if it can move there."""
        if swap.rollback_of is not None:
            target, phase = swap.rollback_of, SwapPhase.ROLLED_BACK
        elif swap.recovers is not None:
            target, phase = swap.recovers, SwapPhase.FIXED_FORWARD
        else:
            return None
        other = self._journal.find(target)
        if other is None or not (other.state is phase or other.state.can_become(phase)):
            return None  # e.g. a fix forward of a swap that had completed: it stays completed
        return target, phase

    # -- failures ---------------------------------------------------------------------------
    def _fail(self, swap: SwapRecord, reason: str, code: ReasonCode) -> None:
        """Before the cut: the swap fails and the old query keeps serving; then its graph goes."""
        failed = self._journal.advance(
            swap,
            SwapPhase.FAILED,
            error=reason,
            reason_code=code,
            when=lambda r: r.state.is_before_cut and r.state.is_in_flight,
        )
        if failed is not None:
            log.warning("swap failed", swap_id=swap.id, reason=reason, reason_code=code)
            # A recovery's graph may share the stranded query's topic: discard keeps a topic in use.
            if self._graphs.get(swap.to_query) is not None:
                self._graphs.discard(swap.to_query)

    def graphs_failed(self, failed: list[tuple[GraphRecord, str]]) -> None:
        """Graphs that stayed dead after their restarts. Before a cut a failing new query already
        failed its swap; after it, the swap is `stranded` (recorded, with its query made current, in
        one write, before anything else changes): routing keeps W, its rows wait in its topic, and
        the old graph keeps its windows up to W."""
        swaps = self._journal.all()
        for record, reason in failed:
            deployed_by = next((s.id for s in reversed(swaps) if s.to_query == record.query_id), None)
            way_out = (
                f"`hotswap rollback {deployed_by}` or `hotswap submit FILE --fix {deployed_by}` takes it over"
                if deployed_by is not None
                else "`hotswap replace FILE` takes it over with a fixed query, or fix the cause and restart "
                "`hotswap run` to resume it from its checkpoint"
            )
            if self._graphs.under_error_budget(record.query_id):
                failure = f"query {record.query_id} failed more often than its error budget allows ({reason})"
            else:
                failure = (
                    f"query {record.query_id} kept failing after {self._recovery.query_restarts} restarts ({reason})"
                )
            message = f"{failure}; its input waits in topic {record.topic}: {way_out}"
            swap = next(
                (s for s in swaps if s.to_query == record.query_id and s.state.is_draining and not s.state.is_stranded),
                None,
            )
            if self._drain_stalled(record, swaps, failure):
                continue
            if swap is None:
                log.error("query failed", query_id=record.query_id, error=message)
                self._roll_back_completed(record, swaps, failure)
                continue
            current = CurrentQuery(query_id=record.query_id, started_at=record.started_at or now_ms())
            back = self._automatic_rollback(swap, swaps, failure)
            if back is not None:
                message = f"{failure}; rolled back automatically by swap {back.id}"
            stranded = self._journal.advance(
                swap,
                SwapPhase.STRANDED,
                error=message,
                reason_code=ReasonCode.QUERY_FAILED_AFTER_CUT,
                when=lambda r: r.state.is_draining and not r.state.is_stranded,
                also=Also(current=current, creates=back),
            )
            if stranded is not None:
                log.error("swap stranded after its cut", swap_id=swap.id, query_id=record.query_id, error=message)
                if back is not None:
                    self._log(back).warning("automatic rollback queued", rolls_back=swap.id, cause=back.cause)

    def _drain_stalled(self, record: GraphRecord, swaps: list[SwapRecord], failure: str) -> bool:
        """The old graph of a drain failed for good on stalled batches: the drain cannot end by
        itself, so the swap says so (`drain_stalled`, in status) and waits for an operator. Past
        the cut nothing is undone: the new query keeps its windows, and a restarted `hotswap run`
        resumes the old graph from its checkpoint to emit the rest."""
        if record.query_id not in self._graphs.stalls:
            return False
        swap = next((s for s in swaps if s.from_query == record.query_id and s.state.is_draining), None)
        if swap is None or swap.state.is_stranded:
            return False
        message = (
            f"the drain stalled: {record.query_id} failed for good ({failure}); its windows through "
            f"{clock(swap.cut_window_end)} are still to be emitted: fix the cause (the cluster, the query's "
            "data), then restart `hotswap run`, which resumes it from its checkpoint"
        )
        self._journal.update(swap, error=message, reason_code=ReasonCode.DRAIN_STALLED)
        self._log(swap).error("drain stalled", from_query=record.query_id, reason_code=ReasonCode.DRAIN_STALLED)
        return True

    def _roll_back_completed(self, record: GraphRecord, swaps: list[SwapRecord], failure: str) -> None:
        """A query serving since its swap completed, failed for good: a swap with auto-rollback is
        rolled back now, the swap back taking over its buffer (as `hotswap rollback` would)."""
        current = self._graphs.current()
        done = next((s for s in reversed(swaps) if s.to_query == record.query_id), None)
        if done is None or done.state is not SwapPhase.COMPLETED or current is None:
            return
        if current.query_id != record.query_id:
            return
        back = self._automatic_rollback(done, swaps, failure)
        if back is not None:
            self._journal.create(back)
            self._log(back).warning("automatic rollback queued", rolls_back=done.id, cause=back.cause)

    def _rolls_back_itself(self, swap: SwapRecord) -> bool:
        """Submitted with --auto-rollback, or the namespace's default says so; never a rollback itself
        (rolling a rollback back would only bring back the query that failed)."""
        return (swap.auto_rollback or self._recovery.auto_rollback) and swap.rollback_of is None

    def _automatic_rollback(self, swap: SwapRecord, swaps: list[SwapRecord], reason: str) -> SwapRecord | None:
        """For a swap with auto-rollback, stranded now: the swap back to its previous query, which
        takes over its buffer (queued in the write that strands it, so a crash cannot lose it)."""
        if not self._rolls_back_itself(swap) or swap.from_query is None:
            return None
        if any(other.rollback_of == swap.id or other.recovers == swap.id for other in swaps):
            return None
        previous = self._graphs.get(swap.from_query)
        if previous is None:
            return None
        return rollback_swap(swap, previous, takes_over=True, cause=f"automatic rollback of swap {swap.id}: {reason}")

    # -- clean-up ---------------------------------------------------------------------------
    def _clean_up(self, swaps: list[SwapRecord]) -> None:
        """Remove the graphs of swaps that ended before their cut (aborted, failed) since the last
        step, and retire the old graph of a stranded swap once it has emitted its windows through W."""
        open_ids = {s.id for s in swaps}
        for swap_id in self._open_ids - open_ids:
            self._deploy_began.pop(swap_id, None)
            self._awaited.pop(swap_id, None)
            self._retire_began.pop(swap_id, None)
            ended = self._journal.find(swap_id)
            if ended is not None and ended.state.is_terminal and not ended.state.is_done:
                self._remove_graph_of(ended)
        self._open_ids = open_ids
        for swap in swaps:
            if swap.state.is_stranded and swap.from_query and swap.cut_window_end is not None:
                self._retire_drained_old_graph(swap)

    def _remove_graph_of(self, swap: SwapRecord) -> None:
        current = self._graphs.current()
        if swap.new_window_ms is None or (current is not None and current.query_id == swap.to_query):
            return  # rejected (it has no graph), or its graph serves
        record = self._graphs.get(swap.to_query)
        running = swap.to_query in self._graphs.runner.known()
        if running or (record is not None and not record.state.is_ended):
            log.info("removing graph of ended swap", swap_id=swap.id, query_id=swap.to_query, state=swap.state)
            self._graphs.discard(swap.to_query)

    def _retire_drained_old_graph(self, swap: SwapRecord) -> None:
        """After a swap was stranded, its old graph is still retired once it has drained."""
        assert swap.from_query is not None
        assert swap.cut_window_end is not None
        old = self._graphs.get(swap.from_query)
        if old is None or old.state is not GraphState.RUNNING:
            return
        if reached_cut(self._progress.committed_through(swap.from_query), swap.cut_window_end):
            if not self._graphs.stop(swap.from_query):
                return  # stopping: the next step looks again
            self._graphs.save(old.moved(GraphState.RETIRED))
            self._graphs.remove_topic(old)
            self._progress.forget(swap.from_query)
