"""Throughput: how fast each pipeline drains a pre-loaded backlog, as the slope of rows processed
against time over the steady part of the drain.

One backlog serves every run: `events` seeded events written once, in event-time order, by a Spark
batch job (fast, and no Python generator to measure by mistake), to one topic that each run reads
from its start under its own namespace. Runs alternate: plain Spark, hotswap on each execution-graph
engine, plain Spark, ... (common.SIDES); each engine's ratio is against plain Spark's run of the
same round.

Rows processed over time are read from the results topic, the same way for both sides: each
result's Kafka timestamp and the events it counts (`n`), one point per burst of results (a batch's
write). The slope is fitted over the points between 10 % and 90 % of the rows, so neither the
start-up before the first batch nor the last windows' close counts. The drain ends, for both sides,
when the results of the last window the backlog can close are in the topic.

Beside it, from Spark's progress reports read once the drain is over: the same slope per query
(rows in against batch end; for hotswap the service graph and the execution graph apart), each
query's median batch durations, and CPU per 1,000 events at saturation; for hotswap, the Spark
tasks each execution-graph batch ran and the graph topic's partitions.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import (
    ENGINES,
    KEYS,
    LATENESS_MS,
    PLAIN,
    QUERY,
    SIDES,
    WINDOW_MS,
    Bench,
    emitted_from,
    settings_for,
    suffix,
    wait_for,
)
from benchmarks.measures import batch_points, emission_points, paired_ratios, per_thousand, ratio, spread, steady_slope
from benchmarks.pipelines import HotswapPipeline, Pipeline, PlainPipeline
from benchmarks.profile import (
    codegen,
    codegen_per_batch,
    duration_medians,
    merge,
    progress_between,
    stage_samples,
)
from hotswap.contract import stages
from hotswap.contract.models import GraphEngine, now_ms
from hotswap.contract.settings import Settings

T0 = 1_700_000_000_000  # a fixed past event time: the backlog is replayed, not live
EVENT_TIME_RATE = 1_000  # events per second of event time: 10,000 per 10 s window over 1,000 keys
DISORDER_MS = 500


def preload(bench: Bench, settings: Settings, events: int) -> tuple[int, float]:
    """Write the backlog; returns the end of the last window it can close and the write rate."""
    bench.topics(settings)
    began = time.monotonic()
    # One partition, so the events reach Kafka in event-time order (each source partition stays ordered
    # up to the disorder), as a live source would; keys spread them over the topic's partitions.
    (
        bench.spark.range(0, events, 1, 1)
        .selectExpr(
            f"concat('k', CAST(pmod(xxhash64(id, 1), {KEYS}) AS STRING)) AS key",
            "round(CAST(pmod(xxhash64(id, 2), 100000) AS DOUBLE) / 1000, 3) AS value",
            f"{T0} + id * 1000 DIV {EVENT_TIME_RATE} - pmod(xxhash64(id, 3), {DISORDER_MS}) AS ts",
        )
        .selectExpr("key", "to_json(named_struct('key', key, 'value', value, 'ts', ts)) AS value")
        .write.format("kafka")
        .options(**settings.spark_kafka_options())
        .option("topic", settings.source_topic)
        .mode("append")  # Kafka may be a DataSource V2 source here (executor/control/spark_session.py)
        .save()
    )
    last_ts = T0 + (events - 1) * 1000 // EVENT_TIME_RATE - DISORDER_MS
    closable = last_ts - LATENESS_MS
    return closable - closable % WINDOW_MS, events / (time.monotonic() - began)


def _stage_slopes(progress: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, batches in progress.items():
        points = batch_points(
            (b["start_ms"], int(b["durations_ms"].get("triggerExecution", 0)), b["rows"]) for b in batches
        )
        out[name] = {
            "rows_per_s": steady_slope(points)["events_per_s"],
            "batches": len(batches),
            "batch_durations_ms": duration_medians(batches),
        }
    return out


def drain(
    bench: Bench, side: str, source_topic: str, events: int, target_end: int, timeout_s: float, phase: str | None = None
) -> dict[str, Any]:
    settings = settings_for(f"tp-{side}", source_topic=source_topic, engine=ENGINES.get(side, GraphEngine.STATEFUL))
    bench.topics(settings)
    watcher = bench.watcher(settings)
    pipeline: Pipeline = (
        PlainPipeline(bench.spark, settings, QUERY)
        if side == PLAIN
        else HotswapPipeline(bench.spark, settings, QUERY, side)
    )
    loaded = f"backlog_1m_catch_up{suffix(side)}" if events >= 1_000_000 else f"throughput_{side}"
    bench.resources.phase(phase or ("throughput_plain" if side == PLAIN else loaded))
    stages.reset()
    before = codegen(bench.spark)
    began = now_ms()
    try:
        pipeline.start()
        wait_for(
            lambda: any(w[1] >= target_end for w in watcher.windows()),
            timeout_s,
            f"{side} results through the backlog's last window",
        )
        ended = now_ms()
        queries = pipeline.queries()
        progress = {name: progress_between(q, began, ended) for name, q in queries.items()}
        samples = stage_samples(settings) if side != PLAIN else {}
        after = codegen(bench.spark)
        graphs = pipeline.graph_report(queries, began, ended) if isinstance(pipeline, HotswapPipeline) else None
    finally:
        bench.resources.phase("idle")
        pipeline.stop()
        results = emitted_from(watcher.stop())
    bench.resources.refresh()
    counted = [e for e in results if e.window_end <= target_end]
    points = emission_points((e.emit_ms, e.n) for e in counted)
    slope = steady_slope(points)
    first_batch = min((b["start_ms"] for batches in progress.values() for b in batches), default=began)
    last_result = max((e.emit_ms for e in counted), default=ended)
    rows = sum(e.n for e in counted)
    cpu: dict[str, float | None] = {}
    elsewhere: dict[str, float | None] = {}
    steady_rows = 0
    if slope["from_ms"] is not None and slope["to_ms"] is not None:
        cpu = {n: bench.resources.cpu_s(n, slope["from_ms"], slope["to_ms"]) for n in bench.resources.pids}
        elsewhere = bench.resources.elsewhere(slope["from_ms"], slope["to_ms"])
        at = dict(points)
        steady_rows = at[slope["to_ms"]] - at[slope["from_ms"]]
    work = [cpu.get("spark_jvm"), cpu.get("bench_python")]
    work_cpu = None if not cpu or any(c is None for c in work) else sum(c for c in work if c is not None)
    return {
        "side": side,
        "namespace": settings.namespace,
        "events_per_s": slope["events_per_s"],
        "slope": slope,
        "rows_counted": rows,
        "end_to_end_s": round((last_result - first_batch) / 1000, 2),
        "end_to_end_events_per_s": round(rows / ((last_result - first_batch) / 1000))
        if last_result > first_batch
        else None,
        "start_to_first_batch_s": round((first_batch - began) / 1000, 2),
        "cpu_s_per_1000_events": per_thousand(work_cpu, steady_rows),
        "cpu_s": cpu,
        "elsewhere": elsewhere,
        "queries": _stage_slopes(progress),
        "codegen": codegen_per_batch(before, after, sum(len(b) for b in progress.values())),
        "graphs": graphs,
        "stage_samples": samples,
        "series": points,
    }


def run_throughput(bench: Bench, events: int, rounds: int, timeout_s: float) -> dict[str, Any]:
    source = settings_for("tp-source")
    target_end, write_rate = preload(bench, source, events)
    bench.clock.step(f"throughput: {events:,} events pre-loaded at {write_rate:,.0f} ev/s (Spark batch write)")
    runs: list[dict[str, Any]] = []
    per_round: list[dict[str, float | None]] = []
    samples: dict[str, dict[str, dict[str, list[float]]]] = {}  # side -> role -> stage -> seconds
    for round_no in range(1, rounds + 1):
        rates: dict[str, float | None] = {}
        for side in SIDES:
            bench.clock.step(f"throughput round {round_no}: {side} draining")
            try:
                run = drain(bench, side, source.source_topic, events, target_end, timeout_s)
            except Exception as exc:  # noqa: BLE001 - one failed drain is recorded; the other contenders go on
                run = {"side": side, "error": f"{type(exc).__name__}: {exc}", "events_per_s": None, "stage_samples": {}}
                bench.clock.step(f"throughput round {round_no}: {side} failed: {run['error']}")
            run["round"] = round_no
            merge(samples.setdefault(side, {}), run.pop("stage_samples"))
            runs.append(run)
            rates[side] = run["events_per_s"]
            if "error" not in run:
                bench.clock.step(
                    f"throughput round {round_no}: {side} {run['events_per_s']} ev/s (slope), "
                    f"{run['end_to_end_s']}s end to end"
                )
        per_round.append(rates)
    rates_by_side = {side: spread((r.get(side) for r in per_round), 0) for side in SIDES}
    # Each engine against plain Spark's drain of the same round, then the spread over rounds.
    ratios = {side: paired_ratios((r.get(side), r.get(PLAIN)) for r in per_round) for side in ENGINES}
    plain = rates_by_side[PLAIN]
    return {
        "method": (
            "slope of events counted by the results against their Kafka timestamps, rows 10-90 % of a "
            f"pre-loaded backlog of {events:,} events; {rounds} alternating rounds"
        ),
        "events": events,
        "preload_events_per_s": round(write_rate),
        **{f"{side}_events_per_s": rates_by_side[side] for side in SIDES},
        # The stateful engine's under the names every earlier run used; every engine's by side.
        "throughput_ratio": ratios["hotswap"],
        "ratio_of_medians": _ratio_of_medians(rates_by_side["hotswap"], plain),
        "throughput_ratios": ratios,
        "ratios_of_medians": {side: _ratio_of_medians(rates_by_side[side], plain) for side in ENGINES},
        "runs": runs,
        "stage_samples": samples,
    }


def _ratio_of_medians(side: dict[str, Any] | None, plain: dict[str, Any] | None) -> float | None:
    return ratio(side["median"] if side else None, plain["median"] if plain else None)


def warm_up(bench: Bench, events: int = 40_000) -> dict[str, Any]:
    """A short drain on each side before anything is measured, so round 1 does not pay for a cold
    JVM (class loading, JIT, first code generation): in runs without it, round 1 of each side had two
    to four times the steady latency of the later rounds. Nothing of it counts."""
    source = settings_for("warm-source")
    target_end, _ = preload(bench, source, events)
    began = time.monotonic()
    out: dict[str, Any] = {"events": events}
    # Every contender once: the closing engine's batch reads (Spark's Kafka batch source) warm too.
    for side in SIDES:
        run = drain(bench, side, source.source_topic, events, target_end, 300, phase="warm_up")
        out[side] = {"events_per_s": run["events_per_s"], "end_to_end_s": run["end_to_end_s"]}
    out["seconds"] = round(time.monotonic() - began, 1)
    bench.resources.phase("idle")
    return out
