"""The live rounds: plain Spark and hotswap on each execution-graph engine alternate under the same
paced load (plain, hotswap, hotswap_closing, plain, ...: common.SIDES), each on a fresh namespace,
and each round measures steady-state result latency.

A segment is one pipeline under load:
1. start the pipeline, then the generator (its own process, event time = wall time);
2. warm: wait for the first result (read from the results topic by the watcher process, the same
   way for both sides);
3. steady: the next `steady_windows` windows that start at or after the first result's window end;
   their results' latency is the steady latency, and the CPU over the first `steady_s` after warm
   is the cost at the base rate; for hotswap, the Spark tasks each execution-graph batch ran then,
   and its graph topic's partitions;
4. then, by round: nothing; the cost steps (the rate raised step by step, CPU per 1,000 events at
   each); or the change itself: stop-and-restart for plain Spark, two live swaps (and a promoted
   shadow) for each hotswap engine.

Result latency = the result's Kafka timestamp (set by Spark's Kafka producer from the wall clock
when the result is sent; the ResultWriter writes no timestamp column) minus the moment its window
could first close (window end + lateness).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from benchmarks.common import (
    CHANGED,
    ENGINES,
    LATENESS_MS,
    PLAIN,
    QUERY,
    SIDES,
    WINDOW_MS,
    Bench,
    Emitted,
    audit_summary,
    coverage,
    emitted_from,
    latency_ms,
    latency_series,
    settings_for,
    source_counts,
    stats,
    suffix,
    wait_for,
    window_gaps,
)
from benchmarks.measures import batch_points, change_between, drain_batches, per_thousand, swap_phases
from benchmarks.pipelines import HotswapPipeline, Pipeline, PlainPipeline
from benchmarks.probe import LoadProcess, ResultWatcher
from benchmarks.profile import (
    Codegen,
    codegen,
    codegen_per_batch,
    duration_medians,
    merge,
    progress_between,
    stage_samples,
)
from hotswap.contract import stages
from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphEngine, now_ms
from hotswap.execution_graph.graph import GraphQuery
from hotswap.executor.operator.client import Client
from hotswap.service_sink.audit import audit, read_results

WARM_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class LiveShape:
    rate: float  # events per second: the base load of every segment
    rounds: int
    steady_windows: int  # windows of steady latency per segment
    steady_s: float  # the CPU interval at the base rate: a multiple of the window, so it holds whole emissions
    cost_rates: tuple[float, ...]  # the higher rates of the cost steps (the base rate is the first)
    settle_s: float  # after a rate change, before measuring
    measure_s: float  # per cost step; a multiple of the window too
    after_swap_s: float
    restart_after_s: float
    # The closing engine's cost steps (in the cost round) and shadow promotion (in the last round).
    # QUICK leaves them out: a third contender already adds half as much again to the run, and these
    # two are not among the measures the engines are compared on (throughput, steady latency, swap).
    closing_extras: bool = True


@dataclass
class Interval:
    """A measured period under one rate: CPU and events between two moments."""

    rate: float
    from_ms: int
    to_ms: int
    sent: int
    # Query role -> rows it processed within the interval, interpolated over its batches' ends; None
    # until a batch of every query has ended after the interval (see Segment.fill_processed).
    processed: dict[str, int] | None = None
    batches: dict[str, int] = field(default_factory=dict)  # query role -> batches that ended within

    def cost(self, bench: Bench, last_stage: str) -> dict[str, Any]:
        cpu = {name: bench.resources.cpu_s(name, self.from_ms, self.to_ms) for name in bench.resources.pids}
        work = [cpu.get("spark_jvm"), cpu.get("bench_python")]
        work_cpu = None if any(c is None for c in work) else sum(c for c in work if c is not None)
        by_query = self.processed or {}
        last = [rows for role, rows in by_query.items() if role.startswith(last_stage)]
        processed = sum(last) if last else None
        # Kept up: the last stage processed (nearly) what was sent. If not, the cost is per event processed.
        kept_up = None if processed is None else processed >= 0.9 * self.sent
        events = self.sent if kept_up or processed is None else processed
        seconds = (self.to_ms - self.from_ms) / 1000
        return {
            "target_rate": self.rate,
            "seconds": round(seconds, 1),
            "sent_rate": round(self.sent / seconds) if seconds else None,
            "processed_rate": round(processed / seconds) if seconds and processed is not None else None,
            "kept_up": kept_up,
            "cpu_s": cpu,
            "work_cpu_s": None if work_cpu is None else round(work_cpu, 3),
            "cpu_s_per_1000_events": per_thousand(work_cpu, events),
            "kafka_cpu_s_per_1000_events": per_thousand(cpu.get("kafka_broker"), events),
            "redis_cpu_s_per_1000_events": per_thousand(cpu.get("redis"), events),
            "cores_busy": None if work_cpu is None or not seconds else round(work_cpu / seconds, 2),
            "processed_by_query": by_query,
            "batches_by_query": self.batches,
            # Per batch of every query: the fixed cost a batch carries, whatever it holds.
            "cpu_s_per_batch": None
            if work_cpu is None or not sum(self.batches.values())
            else round(work_cpu / sum(self.batches.values()), 3),
            **bench.resources.elsewhere(self.from_ms, self.to_ms),
        }


class Segment:
    """One pipeline under the paced load, on its own namespace; a context manager that stops the
    generator, the pipeline and the watcher (in that order) and keeps every result."""

    def __init__(self, bench: Bench, pipeline: Pipeline, shape: LiveShape, seed: int) -> None:
        self.bench = bench
        self.pipeline = pipeline
        self.shape = shape
        self.settings = pipeline.settings
        self.seed = seed
        self.watcher: ResultWatcher | None = None
        self.load: LoadProcess | None = None
        self.results: list[Emitted] = []
        self.load_start_ms = 0
        self.warm_ms: int | None = None
        self.steady_windows: list[int] = []
        self.intervals: list[Interval] = []
        self.profile: dict[str, Any] = {}
        self.stage_samples: dict[str, dict[str, list[float]]] = {}

    def __enter__(self) -> Segment:
        self.bench.topics(self.settings)
        self.watcher = self.bench.watcher(self.settings)
        try:
            self.pipeline.start()
            self.load = self.bench.load(self.settings, self.shape.rate, self.seed)
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)  # no process of a failed start is left behind
            raise
        self.load_start_ms = now_ms()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self.load is not None:
                self.load.stop()
        finally:
            try:
                self.pipeline.stop()
            finally:
                if self.watcher is not None:
                    self.results = emitted_from(self.watcher.stop())

    @property
    def side(self) -> str:
        return self.pipeline.side

    def windows(self) -> list[tuple[int, int, int, int, int, int]]:
        assert self.watcher is not None
        return self.watcher.windows()

    def sent(self) -> tuple[int, int]:
        assert self.load is not None
        return self.load.sent()

    def measure_steady(self) -> None:
        """Warm, then the steady windows and the CPU interval at the base rate."""
        bench, shape = self.bench, self.shape
        wait_for(lambda: bool(self.windows()), WARM_TIMEOUT_S, f"first results ({self.side})", poll_s=0.25)
        seen = self.windows()
        self.warm_ms = min(w[2] for w in seen)
        first_end = min(w[1] for w in seen)
        stages.reset()
        before = codegen(bench.spark)
        sent_a, at_a = self.sent()
        bench.clock.step(f"live: {self.side} warm {(self.warm_ms - self.load_start_ms) / 1000:.1f}s after the load")

        def steady() -> bool:
            later = [w for w in self.windows() if w[0] >= first_end]
            return len(later) >= shape.steady_windows and now_ms() >= at_a + shape.steady_s * 1000

        wait_for(steady, WARM_TIMEOUT_S, f"{shape.steady_windows} steady windows ({self.side})", poll_s=0.25)
        time.sleep(1.0)  # the last window's results leave in one batch; let the rest of it land
        sent_b, at_b = self.sent()
        self.steady_windows = sorted(w[0] for w in self.windows() if w[0] >= first_end)[: shape.steady_windows]
        self.intervals.append(Interval(shape.rate, at_a, at_b, sent_b - sent_a))
        self.profile = self._profile(at_a, at_b, before)
        self.fill_processed(timeout_s=30)

    def fill_processed(self, timeout_s: float) -> None:
        """Rows each query processed within each measured interval, once a batch of every query has
        ended after it: the cumulative rows at each batch's end, interpolated at both ends (so a batch
        that straddles an end counts for its share). Waits up to `timeout_s` for those batches."""
        deadline = time.monotonic() + timeout_s
        while True:
            pending = [i for i in self.intervals if i.processed is None]
            if not pending:
                return
            points = {
                name: batch_points(
                    (b["start_ms"], int(b["durations_ms"].get("triggerExecution", 0)), b["rows"])
                    for b in progress_between(query, 0, 2**62)
                )
                for name, query in self.pipeline.queries().items()
            }
            for interval in pending:
                rows = {name: change_between(got, interval.from_ms, interval.to_ms) for name, got in points.items()}
                if rows and all(r is not None for r in rows.values()):
                    interval.processed = {name: round(r or 0) for name, r in rows.items()}
                    interval.batches = {
                        name: sum(1 for end, _ in got if interval.from_ms <= end <= interval.to_ms)
                        for name, got in points.items()
                    }
            if time.monotonic() >= deadline:
                return
            time.sleep(0.5)

    def _profile(self, start_ms: int, end_ms: int, before: Codegen | None) -> dict[str, Any]:
        after = codegen(self.bench.spark)
        durations, batches = {}, 0
        queries = self.pipeline.queries()
        for name, query in queries.items():
            got = progress_between(query, start_ms, end_ms)
            batches += len(got)
            durations[name] = {"batches": len(got), **duration_medians(got)}
        profile: dict[str, Any] = {
            "spark_durations_ms": durations,
            "codegen": codegen_per_batch(before, after, batches),
        }
        if isinstance(self.pipeline, HotswapPipeline):
            self.stage_samples = stage_samples(self.settings)
            profile["graphs"] = self.pipeline.graph_report(queries, start_ms, end_ms)
        return profile

    def cost_steps(self) -> None:
        """The rate raised step by step; CPU and events over `measure_s` at each, after `settle_s`."""
        assert self.load is not None
        bench, shape = self.bench, self.shape
        for rate in shape.cost_rates:
            self.load.set_rate(rate)
            settled = time.monotonic() + shape.settle_s
            bench.resources.phase(f"cost_{self.side}_{rate:.0f}")
            bench.clock.step(f"live: {self.side} at {rate:,.0f} ev/s")
            self.fill_processed(timeout_s=shape.settle_s)  # the previous step's, while this one settles
            time.sleep(max(0.0, settled - time.monotonic()))
            sent_a, at_a = self.sent()
            time.sleep(shape.measure_s)
            sent_b, at_b = self.sent()
            self.intervals.append(Interval(rate, at_a, at_b, sent_b - sent_a))
        # The last step's whole windows close lateness + a few batches later: wait for them.
        last = self.intervals[-1]
        closing = last.to_ms - last.to_ms % WINDOW_MS
        try:
            wait_for(lambda: any(w[1] >= closing for w in self.windows()), 60, "the last cost step's windows")
        except TimeoutError:
            bench.clock.step(f"live: {self.side} did not close the last cost step's windows within 60s")
        self.fill_processed(timeout_s=30)

    def steady_latency(self) -> dict[str, Any]:
        return stats([latency_ms(e) for e in self.results if e.window_start in self.steady_windows])

    def costs(self) -> list[dict[str, Any]]:
        last_stage = "plain" if self.side == PLAIN else "graph."
        out = []
        for interval in self.intervals:
            cost = interval.cost(self.bench, last_stage)
            # Latency of the windows wholly inside the step (none for a step shorter than two windows).
            inside = [
                latency_ms(e)
                for e in self.results
                if e.window_start >= interval.from_ms and e.window_end <= interval.to_ms
            ]
            cost["latency"] = stats(inside)
            out.append(cost)
        return out

    def summary(self, round_no: int) -> dict[str, Any]:
        return {
            "side": self.side,
            "round": round_no,
            "namespace": self.settings.namespace,
            "warm_after_load_s": None if self.warm_ms is None else round((self.warm_ms - self.load_start_ms) / 1000, 1),
            "steady_windows": self.steady_windows,
            "steady": self.steady_latency(),
            # The first interval is the steady one: how busy other work kept the machine meanwhile.
            "elsewhere": self.bench.resources.elsewhere(self.intervals[0].from_ms, self.intervals[0].to_ms)
            if self.intervals
            else None,
            "profile": self.profile,
        }


# -- the tails ------------------------------------------------------------------------------------


def _finish(client: Client, swap_id: str, errors: list[str]) -> SwapRecord:
    """The swap's record once terminal; a failed or slow swap is recorded, not fatal: the latency
    numbers around it are still worth having."""
    try:
        return client.wait_until_done(swap_id, 240)
    except Exception as exc:  # noqa: BLE001 - SwapFailed or TimeoutExpired; both end up in the report
        errors.append(f"swap {swap_id}: {type(exc).__name__}: {exc}")
        return client.journal.get(swap_id)


def swap_record(swap: SwapRecord) -> dict[str, Any]:
    """A swap's phases against its floor (benchmarks.measures.swap_phases), with its raw times."""
    recorded = [(p.name.value, p.at) for p in swap.phases]
    breakdown = swap_phases(recorded, swap.cut_window_end, LATENESS_MS)
    at = dict(recorded)
    return {
        "state": swap.state.value,
        "submitted_at_ms": at.get("submitted"),
        "completed_at_ms": at.get("completed"),
        "phase_at_ms": at,
        "cut_window_end_ms": swap.cut_window_end,
        **breakdown,
    }


def promotion_record(swap: SwapRecord | None) -> dict[str, Any] | None:
    """A promoted shadow's phases, with its swap time from the promotion on (it had been running)."""
    if swap is None:
        return None
    record = swap_record(swap)
    completed = record["completed_at_ms"]
    record["promoted_at_ms"] = swap.promoted_at
    record["promote_to_completed_s"] = (
        None if completed is None or swap.promoted_at is None else round((completed - swap.promoted_at) / 1000, 2)
    )
    return record


@dataclass
class SwapTail:
    first: SwapRecord
    second: SwapRecord
    errors: list[str]
    promotion: SwapRecord | None = None
    drains: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None)


def drain_of(graphs: dict[str, GraphQuery], swap: SwapRecord) -> dict[str, Any] | None:
    """The swap's drain, batch by batch, from its old graph's progress (kept by Spark after the stop)."""
    at = {p.name.value: p.at for p in swap.phases}
    query = graphs.get(f"graph.{swap.from_query}")
    if query is None or "draining" not in at or "drained" not in at:
        return None
    return drain_batches(progress_between(query, at["draining"] - 10_000, at["drained"]), at["draining"], at["drained"])


def run_swaps(segment: Segment, pipeline: HotswapPipeline, promote: bool = True) -> SwapTail:
    """The change made live: one swap at the base rate, then one back while the rate doubles, then
    (with `promote`) the same change as a promoted shadow. The resource phases carry the side's
    suffix, so each engine's swap has its own memory peaks."""
    bench, shape, client = segment.bench, segment.shape, pipeline.client
    assert segment.load is not None
    errors: list[str] = []
    tag, side = suffix(pipeline.side), pipeline.side
    bench.resources.phase(f"swap{tag}")
    graphs = pipeline.queries()
    swap = client.submit(CHANGED, CHANGED.stem)
    bench.clock.step(f"live: {side} submitted swap {QUERY.stem} -> {CHANGED.stem}")
    done = _finish(client, swap.id, errors)
    drain = drain_of(graphs, done)
    bench.clock.step(f"live: {side} swap {done.state.value}; {shape.after_swap_s:.0f}s after it")
    bench.resources.phase(f"after_swap{tag}")
    time.sleep(shape.after_swap_s)
    bench.resources.phase(f"swap_at_2x_rate{tag}")
    segment.load.set_rate(2 * shape.rate)
    graphs = pipeline.queries()
    swap2 = client.submit(QUERY, f"{QUERY.stem}_2")
    bench.clock.step(f"live: {side} rate doubled to {2 * shape.rate:.0f} ev/s; submitted swap back")
    done2 = _finish(client, swap2.id, errors)
    drain2 = drain_of(graphs, done2)
    segment.load.set_rate(shape.rate)
    bench.resources.phase(f"after_swap_2x{tag}")
    promoted = None
    if promote:
        bench.clock.step(f"live: {side} swap at 2x rate {done2.state.value}; a shadow of {CHANGED.stem} next")
        promoted = run_promotion(segment, client, errors, tag)
        bench.clock.step(f"live: {side} shadow promoted; letting the last windows close")
    else:
        bench.clock.step(f"live: {side} swap at 2x rate {done2.state.value}; letting the last windows close")
    time.sleep(LATENESS_MS / 1000 + 3)
    return SwapTail(done, done2, errors, promoted, (drain, drain2))


def run_promotion(segment: Segment, client: Client, errors: list[str], tag: str = "") -> SwapRecord | None:
    """The same change as a shadow: started, left to run two windows, then promoted. Its time is
    from `hotswap promote` to completed, against the ordinary swap's submitted to completed."""
    segment.bench.resources.phase(f"promotion{tag}")
    shadow = client.submit(CHANGED, f"{CHANGED.stem}_shadow", shadow=True)
    try:
        client.wait_for(shadow.id, lambda r: r.state is SwapPhase.SHADOWING, 120, "shadowing")
    except Exception as exc:  # noqa: BLE001 - recorded in the report, as a failed swap is
        errors.append(f"shadow {shadow.id}: {type(exc).__name__}: {exc}")
        return None
    time.sleep(2 * WINDOW_MS / 1000)
    client.promote(shadow.id)
    return _finish(client, shadow.id, errors)


def swap_summary(segment: Segment, tail: SwapTail) -> dict[str, Any]:
    results = segment.results
    first, second = swap_record(tail.first), swap_record(tail.second)
    first["drain"], second["drain"] = tail.drains
    submit, completed = first["submitted_at_ms"], first["completed_at_ms"] or first["submitted_at_ms"]
    during = [latency_ms(e) for e in results if submit <= e.emit_ms <= completed]
    s2, c2 = second["submitted_at_ms"], second["completed_at_ms"] or second["submitted_at_ms"]
    during2 = [latency_ms(e) for e in results if s2 <= e.emit_ms <= c2]
    settings = segment.settings
    return {
        "namespace": settings.namespace,
        "latency": {
            "steady": segment.steady_latency(),
            "during_swap": stats(during),
            "during_swap_at_2x_rate": stats(during2),
        },
        "swap": first,
        "swap_at_2x_rate": second,
        "promotion": promotion_record(tail.promotion),
        "output_gap_s": {
            "steady_max": window_gaps(results, segment.load_start_ms, submit - 1),
            "around_swap_max": window_gaps(results, submit, completed + 5_000),
            "around_swap_at_2x_rate_max": window_gaps(results, s2, c2 + 5_000),
        },
        "audit": audit_summary(audit(read_results(settings.kafka, settings.sink_topic, timeout_s=60))),
        "coverage": coverage(results, source_counts(settings)),
        "errors": tail.errors,
        "series": latency_series(results),
    }


@dataclass
class RestartTail:
    stop_ms: int
    started_ms: int


def run_restart(segment: Segment, pipeline: PlainPipeline) -> RestartTail:
    """The change made the way users make it today: stop the plain query, start the new version on
    a fresh checkpoint from `latest` offsets (an incompatible change cannot reuse the old one)."""
    bench, shape = segment.bench, segment.shape
    bench.resources.phase("restart")
    stop_ms = now_ms()
    pipeline.replace(CHANGED)
    started_ms = now_ms()
    bench.clock.step(
        f"restart: stopped, new version started in {(started_ms - stop_ms) / 1000:.1f}s; "
        f"running {shape.restart_after_s:.0f}s"
    )
    time.sleep(shape.restart_after_s)
    return RestartTail(stop_ms, started_ms)


def restart_summary(segment: Segment, tail: RestartTail) -> dict[str, Any]:
    results, settings = segment.results, segment.settings
    first_new = min((e.emit_ms for e in results if e.query_id == CHANGED.stem), default=None)
    steady = segment.steady_latency()
    return {
        "namespace": settings.namespace,
        "stop_at_ms": tail.stop_ms,
        "new_started_at_ms": tail.started_ms,
        "first_new_result_at_ms": first_new,
        "stop_to_first_new_result_s": None if first_new is None else round((first_new - tail.stop_ms) / 1000, 3),
        "steady_p50_latency_s": steady["p50_s"],
        "steady_p99_latency_s": steady["p99_s"],
        "output_gap_s": {
            "steady_max": window_gaps(results, 0, tail.stop_ms - 1),
            "around_restart_max": window_gaps(results, tail.stop_ms, (first_new or tail.stop_ms) + 5_000),
        },
        "audit": audit_summary(audit(read_results(settings.kafka, settings.sink_topic, timeout_s=60))),
        "coverage": coverage(results, source_counts(settings)),
        "series": latency_series(results),
    }


# -- the rounds -----------------------------------------------------------------------------------


@dataclass
class LiveReport:
    """What the live rounds produce; `run.py` files each part under its own key."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # side -> cost steps
    live: dict[str, dict[str, Any]] = field(default_factory=dict)  # hotswap side -> its swaps
    restart: dict[str, Any] | None = None
    stage_samples: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)  # side -> role -> ...
    errors: list[str] = field(default_factory=list)


def run_rounds(bench: Bench, shape: LiveShape, save: Callable[[LiveReport], None]) -> LiveReport:
    """Rounds of plain, then hotswap on each engine. Round 2 (warmed up, not the last) adds the cost
    steps; the last round adds the change: stop-and-restart for plain Spark, the swaps for each
    hotswap engine."""
    report = LiveReport()
    cost_round = min(2, shape.rounds)
    for round_no in range(1, shape.rounds + 1):
        entry: dict[str, Any] = {"round": round_no}
        for side in SIDES:
            try:
                entry[side] = _run_one(bench, shape, side, round_no, cost_round, report)
            except Exception as exc:  # noqa: BLE001 - one failed segment is recorded; the rounds go on
                traceback.print_exc()
                entry[side] = {"error": f"{type(exc).__name__}: {exc}"}
                report.errors.append(f"round {round_no} {side}: {type(exc).__name__}: {exc}")
            bench.resources.phase("idle")
        report.rounds.append(entry)
        save(report)
    return report


def _run_one(
    bench: Bench, shape: LiveShape, side: str, round_no: int, cost_round: int, report: LiveReport
) -> dict[str, Any]:
    last = round_no == shape.rounds
    pipeline: PlainPipeline | HotswapPipeline
    if side == PLAIN:
        pipeline = PlainPipeline(bench.spark, settings_for(f"live{round_no}-plain"), QUERY)
        bench.resources.phase("plain_live")
    else:
        settings = settings_for(f"live{round_no}{suffix(side)}", engine=ENGINES[side])
        pipeline = HotswapPipeline(bench.spark, settings, QUERY, side)
        bench.resources.phase(f"steady{suffix(side)}")
    bench.clock.step(f"live round {round_no}: {side}, {shape.rate:.0f} ev/s over 1,000 keys")
    # The stateful engine and plain Spark always run the extras; the closing engine as the shape says.
    extras = shape.closing_extras or ENGINES.get(side) is not GraphEngine.CLOSING
    swap_tail: SwapTail | None = None
    restart_tail: RestartTail | None = None
    with Segment(bench, pipeline, shape, seed=round_no) as segment:
        segment.measure_steady()
        if round_no == cost_round and extras:
            segment.cost_steps()
        if last and isinstance(pipeline, HotswapPipeline):
            swap_tail = run_swaps(segment, pipeline, promote=extras)
        if last and isinstance(pipeline, PlainPipeline):
            restart_tail = run_restart(segment, pipeline)
    bench.resources.refresh()
    summary = segment.summary(round_no)
    bench.clock.step(
        f"live round {round_no}: {side} steady p50 {summary['steady']['p50_s']}s, p99 {summary['steady']['p99_s']}s"
    )
    merge(report.stage_samples.setdefault(side, {}), segment.stage_samples)
    if round_no == cost_round:
        report.cost[side] = segment.costs()
        summary["cost"] = report.cost[side]
    else:
        summary["cost"] = segment.costs()  # the base rate only
    if swap_tail is not None:
        report.live[side] = swap_summary(segment, swap_tail)
    if restart_tail is not None:
        report.restart = restart_summary(segment, restart_tail)
    return summary
