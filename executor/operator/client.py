"""What the CLI does against a running executor, through Redis only: submit, wait, abort, status."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from hotswap.contract import ownership
from hotswap.contract.errors import ConfigError, TimeoutExpired
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import (
    ExecutorPhase,
    ExecutorRecord,
    GraphProgress,
    GraphRecord,
    GraphState,
    NamespaceRecord,
    QuerySource,
    ShadowDiff,
)
from hotswap.contract.names import (
    DEAD_LETTER,
    DEAD_LETTER_RECORDS,
    EXPIRED_RECORDS,
    LATE_RECORDS,
    ROUTED,
    SKIPPED,
    SKIPPED_READS,
    STALLED,
    Keys,
)
from hotswap.contract.outages import OUTAGES, REDIS
from hotswap.contract.phases import clock
from hotswap.contract.plans import DRY_RUN_TTL_S, DryRunPlan, DryRunRequest
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.records import (
    read_counters,
    read_current,
    read_graphs,
    read_graphs_named,
    read_progress,
    read_service_state,
)
from hotswap.contract.requests import REQUEST_TTL_S, OperatorRequest, RequestAnswer, RequestKind
from hotswap.contract.settings import ControlSettings, KafkaSettings, PipelineSettings
from hotswap.contract.status import (
    CurrentStatus,
    ExecutorStatus,
    GraphStatus,
    OwnerStatus,
    PartitionStatus,
    PhaseStatus,
    ProgressStatus,
    ServiceStatus,
    Status,
    SwapStatus,
)
from hotswap.execution_graph.source import load_query_source
from hotswap.executor.control.recovery import new_swap_id, rollback_swap
from hotswap.executor.control.waits import start_blocker, waiting_for
from hotswap.executor.errors import ExecutorError, Interrupted, RequestNotTaken, SubmitRejected, SwapFailed
from hotswap.service_sink.audit import read_results
from hotswap.service_sink.diff import compare

T = TypeVar("T")


class ReportedRetry(Retry):
    """redis-py's retry, which also says when Redis goes away and when it is back, once each
    (contract/outages.py): the executor's client, whose commands ride out an outage silently."""

    def call_with_retry(  # the same call, its failure handler wrapped
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        def report(error: Exception, *count: int) -> Any:
            OUTAGES.down(REDIS, f"{type(error).__name__}: {error}", "each Redis command, for about a minute")
            return fail(error, *count)

        result = super().call_with_retry(do, report, is_retryable, with_failure_count)
        OUTAGES.up(REDIS)
        return result


def redis_client(control: ControlSettings, retries: int = 40, *, report_outages: bool = False) -> redis.Redis:
    """A client that rides out a Redis restart: by default each command retries with back-off for
    about a minute before it gives up, so a restarted Redis (reloading its append-only file) is
    waited for. One-shot CLI commands pass fewer retries, to fail fast when the stack is down. The
    executor's client reports an outage (`report_outages`) in one line each way.

    Wrong credentials are not worth retrying (redis-py counts them as connection errors), so
    they are checked once up front.
    """
    probe = redis.Redis.from_url(control.redis_dsn.get_secret_value(), socket_timeout=5, socket_connect_timeout=5)
    try:
        probe.ping()
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        raise ConfigError(f"Redis refused the credentials in HOTSWAP_REDIS_URL ({type(exc).__name__})") from exc
    except redis.ConnectionError:
        pass  # down or restarting: the retrying client below waits for it
    finally:
        probe.close()
    return redis.Redis.from_url(
        control.redis_dsn.get_secret_value(),
        socket_timeout=10,
        socket_connect_timeout=5,
        health_check_interval=30,
        retry=(ReportedRetry if report_outages else Retry)(ExponentialBackoff(cap=2.0, base=0.1), retries=retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
    )


def _takeable(swap: SwapRecord, graph: GraphRecord | None) -> bool:
    """The swap's new query failed for good after its cut: during the drain (the swap is stranded)
    or once the swap had completed. Its rows wait in its topic for a successor to take over."""
    if swap.state.is_stranded:
        return True
    return swap.state is SwapPhase.COMPLETED and graph is not None and graph.state is GraphState.FAILED


POLL_S = 0.1  # the executor's loop ticks every 0.25 s
ANSWER_WAIT_S = 30.0  # for the executor to take an abort or a promotion
WITHDRAW_WAIT_S = 10.0
TAKEN_ANSWER_S = 10.0  # from the executor taking a request to its answer: one journal write


class Client:
    def __init__(
        self,
        control: ControlSettings,
        kafka: KafkaSettings,
        pipeline: PipelineSettings,
        client: redis.Redis | None = None,
        *,
        between_polls: Callable[[], object] | None = None,
    ) -> None:
        self._namespace = control.namespace
        self._kafka = kafka
        self._sink_topic = pipeline.sink_topic
        self._redis = client or redis_client(control, retries=3)
        self._keys = Keys(control.namespace)
        # Read only: the executor alone writes the journal (requests carry the operator's changes).
        self.journal = Journal(self._redis, self._keys)
        # What a wait does between two reads; a test that drives the executor's loop itself passes its tick.
        self._between_polls = between_polls or (lambda: time.sleep(POLL_S))

    def submit(
        self,
        path: Path,
        name: str | None = None,
        validation_timeout_s: float = 120.0,
        fix: str | None = None,
        source_schema: str | None = None,
        avro_schema: Path | None = None,
        auto_rollback: bool = False,
        shadow: bool = False,
    ) -> SwapRecord:
        """Queue a swap and return once the executor has validated it; raises SubmitRejected.

        With `fix`, the id of a swap whose new query failed for good after its cut, the query fixes
        it forward: it takes over the failed query's buffer for every window that query did not emit.
        `source_schema` (DDL) or `avro_schema` (an .avsc file) declare the schema this version reads;
        without them it reads the schema of the query it replaces.
        With `auto_rollback`, the executor rolls the swap back itself if its new query fails for good
        after the cut (docs/guarantees.md, "Automatic rollback"). With `shadow`, the query runs beside the current
        one, its results to its own topic, until `promote` (docs/operations.md, "Shadow runs").
        """
        source = _declared_source(path, name, source_schema, avro_schema)
        if fix is not None:
            self._to_take_over(fix, "fixed forward")
        swap = SwapRecord(
            id=new_swap_id(),
            to_query=source.name,
            source=source,
            recovers=fix,
            auto_rollback=auto_rollback,
            shadow=shadow,
        )
        return self._queue(swap, validation_timeout_s)

    def replace(
        self,
        path: Path,
        name: str | None = None,
        validation_timeout_s: float = 120.0,
        source_schema: str | None = None,
        avro_schema: Path | None = None,
    ) -> SwapRecord:
        """Replace the serving query after it failed for good: the new query takes over its buffer
        for every window it did not emit, exactly once. If a swap made it current, this is `submit
        --fix` of that swap; the namespace's first query, which no swap made current, is taken over
        by a swap that `replaces` it."""
        source = _declared_source(path, name, source_schema, avro_schema)  # bad input first, in one line
        current = read_current(self._redis, self._keys)
        if current is None:
            raise ExecutorError("no query serves the namespace; start one with `hotswap run --query FILE`")
        graph = read_graphs_named(self._redis, self._keys, [current.query_id]).get(current.query_id)
        if graph is None or graph.state is not GraphState.FAILED:
            raise ExecutorError(
                f"query {current.query_id} serves and is {graph.state if graph else 'unknown'}; `hotswap replace` "
                "takes over a serving query that failed for good: use `hotswap submit FILE` to swap it"
            )
        made_by = next((s for s in reversed(self.journal.all()) if s.to_query == current.query_id), None)
        if made_by is not None:  # its buffer begins at that swap's cut
            return self.submit(
                path, name, validation_timeout_s, fix=made_by.id, source_schema=source_schema, avro_schema=avro_schema
            )
        for other in self.journal.open():
            if other.replaces == current.query_id:
                raise ExecutorError(
                    f"swap {other.id} ({other.state}) already replaces query {current.query_id}; follow it with "
                    "`hotswap status`"
                )
        swap = SwapRecord(id=new_swap_id(), to_query=source.name, source=source, replaces=current.query_id)
        return self._queue(swap, validation_timeout_s)

    def _to_take_over(self, swap_id: str, what: str) -> SwapRecord:
        """The swap, if its new query failed for good after its cut and nothing took it over yet."""
        swap = self.journal.get(swap_id)
        graph = read_graphs_named(self._redis, self._keys, [swap.to_query]).get(swap.to_query)
        if not _takeable(swap, graph):
            raise ExecutorError(
                f"swap {swap_id} is {swap.state} and its query {swap.to_query} is "
                f"{graph.state if graph else 'unknown'}; only a query that failed for good after its cut can be {what}"
            )
        for other in self.journal.open():
            if other.recovers == swap_id:
                raise ExecutorError(
                    f"swap {other.id} ({other.state}) already took over swap {swap_id}'s query; "
                    f"roll back or fix forward {other.id} instead"
                )
        return swap

    def rollback(self, swap_id: str, validation_timeout_s: float = 120.0) -> SwapRecord:
        """Undo a swap. Before its cut this is `abort`. After it (the swap running or completed), a
        swap back to the previous query is queued, with that query's text from the journal; it cuts
        at the next window boundary W2, and the windows between W and W2 keep the new query's
        results. Returns the aborted swap, or the validated swap back."""
        swap = self.journal.get(swap_id)
        if swap.state.is_before_cut:
            try:
                return self.abort(swap_id)
            except Interrupted:
                raise
            except ExecutorError:
                swap = self.journal.get(swap_id)  # cut meanwhile: roll back after the cut
                if not (swap.state.is_past_cut or swap.state is SwapPhase.COMPLETED):
                    raise
        if swap.state is SwapPhase.ROLLED_BACK:
            raise ExecutorError(f"swap {swap_id} is already rolled back")
        if swap.state is SwapPhase.FIXED_FORWARD:
            raise ExecutorError(f"swap {swap_id} was fixed forward; roll back the swap that fixed it instead")
        recovers = None
        if _takeable(swap, read_graphs_named(self._redis, self._keys, [swap.to_query]).get(swap.to_query)):
            # The previous query takes over the failed one's buffer, from where it stopped.
            self._to_take_over(swap_id, "rolled back")
            recovers = swap_id
        elif not (swap.state.is_past_cut or swap.state is SwapPhase.COMPLETED):
            raise ExecutorError(f"swap {swap_id} ended {swap.state} before its cut; there is nothing to roll back")
        if swap.from_query is None:
            raise ExecutorError(f"swap {swap_id} records no previous query; submit its file instead")
        pending = [s for s in self.journal.open() if s.rollback_of == swap_id]
        if pending:
            raise ExecutorError(
                f"swap {pending[0].id} already rolls back swap {swap_id}; follow it with `hotswap status`, "
                f"or `hotswap abort {pending[0].id}` to start over"
            )
        previous = read_graphs_named(self._redis, self._keys, [swap.from_query]).get(swap.from_query)
        if previous is None:
            raise ExecutorError(f"the journal has no record of query {swap.from_query}; submit its file instead")
        return self._queue(rollback_swap(swap, previous, takes_over=recovers is not None), validation_timeout_s)

    def _queue(self, swap: SwapRecord, validation_timeout_s: float) -> SwapRecord:
        """Ask the executor to record a swap, and return once it has validated it."""
        self._executor_runs("submit")
        began = time.monotonic()
        try:
            self._ask(RequestKind.SUBMIT, swap.id, validation_timeout_s, swap=swap)
            left = max(0.0, validation_timeout_s - (time.monotonic() - began))
            record = self.wait_for(swap.id, lambda r: r.state is not SwapPhase.SUBMITTED, left, "validated")
        except RequestNotTaken:
            raise  # it never reached the journal
        except TimeoutExpired as exc:
            # A submit that says "not validated" must not leave a swap that runs later: it is
            # withdrawn, unless the executor decided it at this very moment.
            if self._withdraw(swap.id):
                raise TimeoutExpired(
                    f"swap {swap.id} was not validated within {validation_timeout_s:.0f}s, so it is withdrawn and "
                    "nothing changed; is the executor busy? submit again, with a longer --timeout"
                ) from exc
            record = self.journal.get(swap.id)
            if record.state is SwapPhase.ABORTED:
                raise TimeoutExpired(
                    f"swap {swap.id} was not validated within {validation_timeout_s:.0f}s, so it is withdrawn and "
                    "nothing changed; is the executor busy? submit again, with a longer --timeout"
                ) from exc
            if record.state is SwapPhase.SUBMITTED:
                raise TimeoutExpired(
                    f"swap {swap.id} was not validated within {validation_timeout_s:.0f}s, and the executor did not "
                    f"take its withdrawal: it waits, `submitted`; `hotswap abort {swap.id}` once the executor answers"
                ) from exc
        except KeyboardInterrupt as exc:
            try:
                withdrawn = self._withdraw(swap.id)
            except (Interrupted, KeyboardInterrupt):
                withdrawn = False
            raise Interrupted(self._interrupted(swap.id, withdrawn)) from exc
        if record.state is SwapPhase.REJECTED:
            raise SubmitRejected(f"rejected ({record.reason_code}): {record.error}", record.reason_code)
        return record

    def _interrupted(self, swap_id: str, withdrawn: bool) -> str:
        """What a submit interrupted by Ctrl-C leaves behind, in one line."""
        record = self.journal.find(swap_id)
        if withdrawn or record is None or record.state is SwapPhase.ABORTED:
            return f"interrupted: swap {swap_id} is withdrawn, nothing changed"
        if record.state is SwapPhase.SUBMITTED:
            return f"interrupted: swap {swap_id} waits for validation and may run; `hotswap abort {swap_id}` to stop it"
        if record.state is SwapPhase.REJECTED:
            return f"interrupted: swap {swap_id} was rejected ({record.reason_code}): {record.error}"
        return (
            f"interrupted: swap {swap_id} was validated meanwhile and goes on; follow it with `hotswap status`, "
            f"or `hotswap abort {swap_id}`"
        )

    def _executor_runs(self, what: str) -> None:
        if not self._redis.exists(self._keys.lease):
            raise ExecutorError(
                f"no executor is running on namespace {self._namespace!r}, and `{what}` is carried out by "
                "it; start one with `hotswap run`"
            )

    def _ask(self, kind: RequestKind, swap_id: str, wait_s: float, swap: SwapRecord | None = None) -> None:
        """Leave a request for the executor and wait for its answer; raises ExecutorError with the
        executor's reason if it refused, and TimeoutExpired if it did not take the request in time
        (then the request is withdrawn, and nothing changed)."""
        request = OperatorRequest(id=uuid.uuid4().hex, kind=kind, swap_id=swap_id, swap=swap)
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._keys.request(request.id), request.model_dump_json(), ex=REQUEST_TTL_S)
        pipe.lpush(self._keys.requests, request.id)
        pipe.execute()
        try:
            answer = self._answer(request.id, wait_s)
        except KeyboardInterrupt:
            if self._redis.delete(self._keys.request(request.id)):  # never taken: nothing changed
                raise Interrupted(f"interrupted: the {kind} of swap {swap_id} is withdrawn, nothing changed") from None
            raise
        if answer is None:
            if self._redis.delete(self._keys.request(request.id)):  # never taken: gone now, nothing changed
                raise RequestNotTaken(
                    f"the executor did not take the {kind} of swap {swap_id} within {wait_s:.0f}s, so the request "
                    "is withdrawn and nothing changed; is the executor busy? see `hotswap status`"
                )
            answer = self._answer(request.id, TAKEN_ANSWER_S)  # taken: its answer follows one journal write
            if answer is None:
                raise TimeoutExpired(
                    f"the executor took the {kind} of swap {swap_id} but did not answer within {TAKEN_ANSWER_S:.0f}s; "
                    "follow the swap with `hotswap status`"
                )
        if not answer.ok:
            raise ExecutorError(answer.error or f"the executor refused the {kind} of swap {swap_id}")

    def _answer(self, request_id: str, wait_s: float) -> RequestAnswer | None:
        """The executor's answer, read within `wait_s`, and never before one pause between two reads
        (a client that was itself descheduled past its deadline still gives the executor a turn)."""
        deadline = time.monotonic() + wait_s
        paused = False
        while True:
            raw = self._redis.get(self._keys.request_answer(request_id))
            if raw is not None:
                answer = RequestAnswer.model_validate_json(raw)
                self._redis.delete(self._keys.request_answer(request_id))  # else its time-to-live does
                return answer
            if paused and time.monotonic() >= deadline:
                return None
            self._between_polls()
            paused = True

    def wait_until_done(self, swap_id: str, timeout_s: float) -> SwapRecord:
        """Until the swap completes; raises SwapFailed once it ended otherwise, or was stranded."""
        record = self.wait_for(swap_id, lambda r: r.state.is_settled, timeout_s, "completed")
        if record.state is not SwapPhase.COMPLETED:
            raise SwapFailed(
                f"swap {swap_id} {record.state} ({record.reason_code}): {record.error}", record.reason_code
            )
        return record

    def wait_for(self, swap_id: str, done: Callable[[SwapRecord], bool], timeout_s: float, what: str) -> SwapRecord:
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.journal.get(swap_id)
            if done(record):
                return record
            if time.monotonic() >= deadline:
                raise TimeoutExpired(
                    f"swap {swap_id} was not {what} within {timeout_s:.0f}s (it is {record.state}); "
                    "follow it with `hotswap status`"
                )
            self._between_polls()

    def _withdraw(self, swap_id: str) -> bool:
        """Abort a swap still waiting for validation; False if it was decided already."""
        try:
            self._ask(RequestKind.WITHDRAW, swap_id, WITHDRAW_WAIT_S)
        except (ExecutorError, TimeoutExpired):
            # Refused (validated meanwhile, or ended) or not answered: either way a swap that was
            # never recorded changed nothing, and one that was is not withdrawn.
            return not self._recorded(swap_id)
        return True

    def _recorded(self, swap_id: str) -> bool:
        return bool(self._redis.exists(self._keys.swap(swap_id)))

    def abort(self, swap_id: str) -> SwapRecord:
        self.journal.get(swap_id)  # an unknown id fails here, in one line
        if self._redis.exists(self._keys.lease):
            self._ask(RequestKind.ABORT, swap_id, ANSWER_WAIT_S)
            return self.journal.get(swap_id)
        # No executor runs, so none can race this write: the operator's user writes the journal itself.
        try:
            aborted = self.journal.advance(
                swap_id,
                SwapPhase.ABORTED,
                error="aborted by operator",
                reason_code=ReasonCode.ABORTED_BY_OPERATOR,
                when=lambda r: r.state.is_before_cut,
            )
        except redis.exceptions.NoPermissionError as exc:
            raise ExecutorError(
                f"no executor is running on namespace {self._namespace!r}, and this Redis user may not "
                f"write the journal; start the executor, then `hotswap abort {swap_id}` again"
            ) from exc
        if aborted is None:
            latest = self.journal.get(swap_id)
            if latest.state is SwapPhase.ABORTED:
                return latest
            raise ExecutorError(
                f"swap {swap_id} is {latest.state}; only a swap before its cut can be aborted"
                if latest.state.is_past_cut
                else f"swap {swap_id} has already ended ({latest.state})"
            )
        return aborted

    def status(self) -> Status:
        """The status document; its core fields are a contract (docs/operations.md, "Status", and
        docs/status.schema.json)."""
        current = read_current(self._redis, self._keys)
        service = read_service_state(self._redis, self._keys)
        counters = read_counters(self._redis, self._keys)
        graphs = read_graphs(self._redis, self._keys)
        lease = self._redis.get(self._keys.lease)
        raw_executor = self._redis.get(self._keys.executor)
        executor = ExecutorRecord.model_validate_json(raw_executor) if raw_executor else None
        swaps = self.journal.all()
        progress = {query_id: read_progress(self._redis, self._keys, query_id) for query_id in graphs}
        raw_namespace = self._redis.get(self._keys.namespace_record)
        namespace = NamespaceRecord.model_validate_json(raw_namespace) if raw_namespace else None
        committed = {q: p.committed_watermark if p else None for q, p in progress.items()}
        return Status(
            namespace=self._namespace,
            executor=ExecutorStatus(
                holder=lease.decode() if isinstance(lease, bytes) else lease,
                # A recorded phase without the lease is a stale record: nobody acts on the namespace.
                phase=executor.phase if executor and lease else ExecutorPhase.STOPPED,
                since=executor.at if executor else None,
            ),
            current=CurrentStatus(query_id=current.query_id, started_at=current.started_at) if current else None,
            swaps=[
                _swap_status(
                    s,
                    waiting_for(s, swaps, service, graphs, committed, start_blocker(current, graphs, swaps, s)),
                    swaps,
                    self._last_diff(s) if s.shadow else None,
                )
                for s in swaps
            ],
            owners=window_owners(swaps, current.query_id if current else None),
            service=ServiceStatus(
                watermark=service.watermark,
                last_batch=service.last_batch,
                partitions={
                    p: PartitionStatus(window_end=n.window_end, event_time=n.event_time, offset=n.offset, idle=n.idle)
                    for p, n in sorted(service.partitions.items(), key=lambda item: int(item[0]))
                },
                stalled_batches=counters.get(f"{STALLED}service", 0),
                skipped_reads=counters.get(SKIPPED_READS, 0),
            ),
            graphs={
                query_id: GraphStatus(
                    state=g.state,
                    topic=g.topic,
                    window_ms=g.window_ms,
                    slide_ms=g.windowing.slide_ms,
                    kind=g.source.kind,
                    started_at=g.started_at,
                    retired_at=g.retired_at,
                    progress=_progress_status(progress[query_id]),
                    source_schema=g.reads.schema_ddl,
                    routed_records=counters.get(f"{ROUTED}{query_id}", 0),
                    engine=g.engine,
                    partitions=g.partitions,
                    stalled_batches=counters.get(f"{STALLED}{query_id}", 0),
                    skipped_batches=counters.get(f"{SKIPPED}{query_id}", 0),
                )
                for query_id, g in graphs.items()
            },
            late_records=counters.get(LATE_RECORDS, 0),
            dead_letter_records=counters.get(DEAD_LETTER_RECORDS, 0),
            expired_records=counters.get(EXPIRED_RECORDS, 0),
            dead_letters={
                name.removeprefix(DEAD_LETTER): n for name, n in counters.items() if name.startswith(DEAD_LETTER)
            },
            source=namespace.source.describe() if namespace else None,
        )

    # -- what the live view, history and dry runs read (issue 20) ------------------------------
    def close(self) -> None:
        self._redis.close()

    def counters(self) -> dict[str, int]:
        """The namespace's cumulative counters (late, dead-letter, expired, routed:<q>, dead_letter:<reason>)."""
        return read_counters(self._redis, self._keys)

    def graph_records(self) -> dict[str, GraphRecord]:
        return read_graphs(self._redis, self._keys)

    # -- shadows ------------------------------------------------------------------------------
    def promote(self, swap_id: str) -> SwapRecord:
        """Ask for a shadow's promotion: the service graph cuts to it at its next batch or tick."""
        self.journal.get(swap_id)  # an unknown id fails here, in one line
        self._executor_runs(f"promote {swap_id}")
        self._ask(RequestKind.PROMOTE, swap_id, ANSWER_WAIT_S)
        return self.journal.get(swap_id)

    def diff(self, swap_id: str, tolerance: float = 1e-9) -> ShadowDiff:
        """A shadow's results against the current version's, for every window both closed since S.

        Reads the results topic and the shadow's results topic from their start (service_sink.diff),
        and keeps the summary for `status`."""
        swap = self.journal.get(swap_id)
        if not swap.shadow:
            raise ExecutorError(f"swap {swap_id} is not a shadow; `hotswap diff` compares a shadow (submit --shadow)")
        if swap.shadow_since is None or swap.from_query is None:
            raise ExecutorError(f"shadow {swap_id} has not started yet (it is {swap.state}); try again in a moment")
        graphs = read_graphs_named(self._redis, self._keys, [swap.from_query, swap.to_query])
        current, shadow = graphs.get(swap.from_query), graphs.get(swap.to_query)
        if current is None or shadow is None or shadow.shadow_results_topic is None:
            raise ExecutorError(f"the graphs of shadow {swap_id} are not recorded; see `hotswap status`")
        closed = [self._committed(q) for q in (current.query_id, shadow.query_id)]
        if swap.cut_window_end is not None:
            closed.append(swap.cut_window_end)  # the current version answers no window after W
        known = [c for c in closed if c is not None]
        closed_through = min(known) if len(known) == len(closed) else swap.shadow_since
        mine = [r for r in read_results(self._kafka, self._sink_topic) if r.query_id == current.query_id]
        theirs = read_results(self._kafka, shadow.shadow_results_topic)
        summary = compare(
            mine,
            theirs,
            current_groups=current.group_columns,
            shadow_groups=shadow.group_columns,
            since=swap.shadow_since,
            closed_through=closed_through,
            tolerance=tolerance,
            shadow_id=swap_id,
        )
        self._redis.set(self._keys.shadow_diff(swap_id), summary.model_dump_json())
        return summary

    def _committed(self, query_id: str) -> int | None:
        progress = read_progress(self._redis, self._keys, query_id)
        return None if progress is None else progress.committed_watermark

    def _last_diff(self, swap: SwapRecord) -> ShadowDiff | None:
        raw = self._redis.get(self._keys.shadow_diff(swap.id))
        return None if raw is None else ShadowDiff.model_validate_json(raw)

    def progress(self, query_id: str) -> GraphProgress | None:
        return read_progress(self._redis, self._keys, query_id)

    def dry_run(
        self,
        path: Path,
        name: str | None = None,
        timeout_s: float = 120.0,
        source_schema: str | None = None,
        avro_schema: Path | None = None,
    ) -> DryRunPlan:
        """Ask the executor what a submit of this query would do now; changes nothing.

        The request and its answer live in Redis with a time-to-live (contract.plans)."""
        source = _declared_source(path, name, source_schema, avro_schema)
        if not self._redis.exists(self._keys.lease):
            raise ExecutorError(
                f"no executor is running on namespace {self._namespace!r}; a dry run needs one "
                "(it validates with Spark): start it with `hotswap run`"
            )
        request = DryRunRequest(id=new_swap_id(), source=source)
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._keys.dry_run(request.id), request.model_dump_json(), ex=DRY_RUN_TTL_S)
        pipe.lpush(self._keys.dry_runs, request.id)
        pipe.expire(self._keys.dry_runs, DRY_RUN_TTL_S)
        pipe.execute()
        deadline = time.monotonic() + min(timeout_s, DRY_RUN_TTL_S)
        while time.monotonic() < deadline:
            raw = self._redis.get(self._keys.dry_run_plan(request.id))
            if raw is not None:
                self._redis.delete(self._keys.dry_run_plan(request.id))
                return DryRunPlan.model_validate_json(raw)
            time.sleep(0.3)
        self._redis.delete(self._keys.dry_run(request.id))
        raise TimeoutExpired(
            f"the executor did not answer the dry run within {min(timeout_s, DRY_RUN_TTL_S):.0f}s; "
            "see its log, and `hotswap status`"
        )


def window_owners(swaps: list[SwapRecord], current: str | None) -> list[OwnerStatus]:
    """Which query version answers which windows: windows ending after `after` and at or before
    `through` (null: unbounded), by the rule each graph's result writer applies (contract.ownership)."""
    return [
        OwnerStatus(query_id=o.query_id, after=o.after, through=o.through, swap_id=o.swap_id)
        for o in ownership.window_owners(swaps, current)
    ]


def _swap_status(
    swap: SwapRecord, waiting: str | None, swaps: list[SwapRecord], diff: ShadowDiff | None = None
) -> SwapStatus:
    undoing = next(
        (s for s in swaps if swap.id in (s.rollback_of, s.recovers) and s.state is SwapPhase.COMPLETED), None
    )
    note = None
    if swap.state in (SwapPhase.ROLLED_BACK, SwapPhase.FIXED_FORWARD) and undoing is not None:
        how = "rolled back" if swap.state is SwapPhase.ROLLED_BACK else "fixed forward"
        note = (
            f"{how} by {undoing.id}: windows ending after {clock(swap.cut_window_end)} through "
            f"{clock(undoing.cut_window_end)} keep {swap.to_query}'s results; {undoing.to_query} answers after that"
        )
    return SwapStatus(
        id=swap.id,
        from_query=swap.from_query,
        to_query=swap.to_query,
        state=swap.state,
        cut_window_end=swap.cut_window_end,
        cut_batch=swap.cut_batch,
        old_window_ms=swap.old_window_ms,
        new_window_ms=swap.new_window_ms,
        old_slide_ms=swap.old_slide_ms,
        new_slide_ms=swap.new_slide_ms,
        phases=[PhaseStatus(name=p.name, at=p.at) for p in swap.phases],
        error=swap.error,
        reason_code=swap.reason_code,
        waiting_for=waiting,
        rollback_of=swap.rollback_of,
        recovers=swap.recovers,
        replaces=swap.replaces,
        auto_rollback=swap.auto_rollback,
        cause=swap.cause,
        shadow=swap.shadow,
        shadow_since=swap.shadow_since,
        promote=swap.promote,
        diff=diff,
        note=note,
    )


def _progress_status(progress: GraphProgress | None) -> ProgressStatus | None:
    if progress is None:
        return None
    return ProgressStatus(
        batch_id=progress.batch_id,
        watermark=progress.watermark,
        committed_batch=progress.committed_batch,
        committed_watermark=progress.committed_watermark,
        num_input_rows=progress.num_input_rows,
    )


def _declared_source(path: Path, name: str | None, source_schema: str | None, avro_schema: Path | None) -> QuerySource:
    """The query file, with the schema its version declares (DDL, or an .avsc file's text), if any."""
    source = load_query_source(path, name)
    if source_schema is None and avro_schema is None:
        return source
    avro_text = None
    if avro_schema is not None:
        try:
            avro_text = avro_schema.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the Avro schema {avro_schema}: {exc.strerror}") from exc
    return source.changed(source_schema=source_schema, avro_schema=avro_text)
