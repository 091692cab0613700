"""`make bench` / `python -m benchmarks.run [--quick]`: the cost of the hot-swap layer and of a swap,
on each execution-graph engine (stateful and closing), beside plain Spark and stop-and-restart, in
one run, so the engines are compared on the same machine state. Run it under the machine-wide lock
on a shared machine (`/work/itest .venv/bin/python -m benchmarks.run --quick`).

The contenders (common.SIDES): plain Spark; `hotswap`, today's stateful execution graph; and
`hotswap_closing`, the closing engine (each window computed once, as a batch, when it closes).

Runs its own embedded stack (ports 29092/29093/26379, under .hotswap/bench), then, after a short
unmeasured drain by each contender to warm the JVM:
1. live rounds, plain Spark and hotswap on each engine alternating, each on a fresh namespace under
   the same paced load: steady-state result latency in every round, with the Spark tasks each
   execution-graph batch ran; in round 2 the cost steps (CPU per 1,000 events as the rate rises);
   in the last round the change itself (two live swaps on each engine, and the same change by
   stop-and-restart of the plain query);
2. throughput rounds, alternating too: the slope of rows processed while each contender drains the
   same pre-loaded backlog;
3. the control state's cost per batch with 200 swaps of history against one (benchmarks.control_state);
4. each sink's cost per batch: the Kafka topic, a Postgres table, a Delta Lake table (benchmarks.sinks);
5. memory and CPU of each process, sampled all along by a process of its own.
The generator, the results watcher and the sampler run in child processes (benchmarks.probe), so
none of them shares the GIL with the executor's foreachBatch. Writes bench/results/<timestamp>.json
and a PNG beside it. A section that fails is recorded with its error and the rest still runs.
At the end it prints the headline table (a column per contender), each engine against the issue's
goals, and the largest stage medians.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import ENGINES, PLAIN, REPO, RESULTS_DIR, SIDES, Bench, Clock, live_key, settings_for
from benchmarks.control_state import run_control_state
from benchmarks.latency import LiveReport, LiveShape, run_rounds
from benchmarks.measures import paired_ratios, spread
from benchmarks.plot import draw
from benchmarks.profile import medians_ms
from benchmarks.report import engine_summary, goals_table, largest_stages, p99_swap_over_steady, table, targets
from benchmarks.resources import Resources, spark_jvm_pid
from benchmarks.sinks import run_sinks
from benchmarks.throughput import run_throughput, warm_up
from hotswap.contract.models import now_ms
from hotswap.executor.control.spark_session import build_spark_session
from hotswap.executor.logs import configure_logging
from hotswap.executor.operator.client import redis_client
from hotswap.executor.stack import EmbeddedStack

QUICK = LiveShape(
    rate=500,
    rounds=3,
    steady_windows=2,
    steady_s=20,
    cost_rates=(2_000, 8_000),
    settle_s=5,
    measure_s=20,
    after_swap_s=5,
    restart_after_s=20,
    # The closing engine's cost steps (about a minute) and promotion (about 45 s) left out: a third
    # contender takes QUICK from about 10 minutes to about 15 without them (an estimate from the
    # sections' times in earlier runs), to 16 or 17 with them.
    closing_extras=False,
)
FULL = LiveShape(
    rate=500,
    rounds=5,
    steady_windows=6,
    steady_s=60,
    cost_rates=(2_000, 8_000),
    settle_s=10,
    measure_s=40,
    after_swap_s=30,
    restart_after_s=40,
    closing_extras=True,
)

# The driver's status store keeps Spark's last 50 jobs and stages (executor/control/spark_session.py),
# a few seconds of a busy driver. The tasks each execution-graph batch ran are read from it after a
# measured period (a drain, a steady period of up to 60 s, at some 10-20 stages a second over every
# query), so the bench's driver keeps more. It costs the driver's heap some megabytes, the same for
# every contender; a `spark_conf` from the environment still wins.
STATUS_RETENTION = {"spark.ui.retainedJobs": "2000", "spark.ui.retainedStages": "3000"}


def _out(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=10, cwd=REPO).stdout.strip()
    except OSError:
        return ""


def machine() -> dict[str, Any]:
    return {
        "nproc": _out("nproc"),
        "free_g": _out("free", "-g"),
        "loadavg_before": list(os.getloadavg()),
        "commit": _out("git", "rev-parse", "--short", "HEAD"),
        "uncommitted_changes": bool(_out("git", "status", "--porcelain", "--untracked-files=no")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="shorter runs (about 15 minutes on 2 cores)")
    args = parser.parse_args()
    quick: bool = args.quick
    run_bench(quick, QUICK if quick else FULL, 200_000 if quick else 1_000_000)


def run_bench(quick: bool, shape: LiveShape, backlog: int, throughput_rounds: int = 3) -> Path:
    """The whole benchmark; returns the JSON's path."""
    configure_logging("console", "warning")
    # Stopping a query cancels its batch in flight (a retired graph, the restarted plain query), and
    # py4j logs each cancelled foreachBatch as an error with a long trace. A failure that matters
    # reaches the report through the section or segment that it ended.
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    clock = Clock()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    json_path, png_path = RESULTS_DIR / f"{stamp}.json", RESULTS_DIR / f"{stamp}.png"
    results: dict[str, Any] = {
        "mode": "quick" if quick else "full",
        "started": stamp,
        "machine": machine(),
        "shape": {**vars(shape), "backlog_events": backlog, "throughput_rounds": throughput_rounds},
    }

    stack_settings = settings_for("stack")
    base = stack_settings.model_copy(update={"spark_conf": {**STATUS_RETENTION, **stack_settings.spark_conf}})
    # hotswap's queries run with trigger_interval (HOTSWAP_TRIGGER_INTERVAL); plain Spark with Spark's default.
    results["trigger"] = {PLAIN: "default", **{side: base.processing_time or "default" for side in ENGINES}}
    stack = EmbeddedStack(base.stack, base.kafka)
    clock.step("stack: starting Kafka and Redis on 29092/26379")
    stack.up()
    pids = {s.name: s.pid for s in stack.status() if s.pid is not None}
    clock.step("spark: starting the session")
    spark = build_spark_session(base.spark)
    watched = {"bench_python": os.getpid(), "kafka_broker": pids.get("kafka"), "redis": pids.get("redis")}
    watched["spark_jvm"] = spark_jvm_pid(pids.get("kafka"), pids.get("redis"))
    detached = [pid for pid in (pids.get("kafka"), pids.get("redis")) if pid is not None]
    resources = Resources({name: pid for name, pid in watched.items() if pid is not None}, detached)
    run_began = now_ms()
    bench = Bench(spark, clock, resources, quick)

    def section(name: str, run: Callable[[], None]) -> None:
        clock.step(f"{name}: start")
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - record it and go on with the next section
            traceback.print_exc()
            results.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
        clock.step(f"{name}: done")
        save(results, json_path)

    def live() -> None:
        def keep(report: LiveReport) -> None:
            file_live(results, report)
            save(results, json_path)

        keep(run_rounds(bench, shape, keep))

    def throughput() -> None:
        tp = run_throughput(bench, backlog, throughput_rounds, 300 if backlog <= 200_000 else 900)
        profile = results.setdefault("profile", {})
        profile.setdefault("stages", {})["drain"] = {
            side: medians_ms(samples) for side, samples in tp.pop("stage_samples").items() if samples
        }
        profile.setdefault("spark_durations_ms", {})["drain"] = _drain_durations(tp["runs"])
        profile.setdefault("codegen", {})["drain"] = _drain_codegen(tp["runs"])
        results["throughput"] = tp

    def warm() -> None:
        results["warm_up"] = warm_up(bench)

    def control_state() -> None:
        results["control_state"] = run_control_state(spark, redis_client(base.control))

    def sinks() -> None:
        results["sinks"] = run_sinks(quick)

    try:
        section("warm-up", warm)
        section("live", live)
        section("throughput", throughput)
        section("control state", control_state)
        section("sinks", sinks)
    finally:
        run_ended = now_ms()
        resources.stop()
        spark.stop()
        stack.down()
    results["memory"] = resources.summary()
    sampled = resources.span()
    if sampled is not None:
        run_began, run_ended = max(run_began, sampled[0]), min(run_ended, sampled[1])
    results["machine"]["elsewhere_during_run"] = resources.elsewhere(run_began, run_ended)
    if quick:
        results["memory"]["backlog_1m_catch_up"] = "skipped in QUICK mode"
    results["throughput_ratio"] = _median((results.get("throughput") or {}).get("throughput_ratio"))
    results["p99_swap_over_steady"] = p99_swap_over_steady(results, "hotswap")
    results["engines"] = {side: engine_summary(results, side) for side in ENGINES}
    results["targets"] = targets(results)
    results["machine"]["loadavg_after"] = list(os.getloadavg())
    results["elapsed_s"] = round(clock.elapsed(), 1)
    save(results, json_path)
    try:
        draw(results, png_path)
    except Exception:  # noqa: BLE001 - the numbers are saved; a plot failure must not hide them
        traceback.print_exc()
    clock.step(f"wrote {json_path} and {png_path.name}")
    print(table(results))
    print()
    print(goals_table(results))
    print("largest stage medians:")
    print(largest_stages(results))
    print(json.dumps(results["targets"], indent=2))
    return json_path


def _median(value: Any) -> Any:
    return value.get("median") if isinstance(value, dict) else value


def _steady_p99(entry: dict[str, Any], side: str) -> float | None:
    value = (((entry.get(side) or {}).get("steady")) or {}).get("p99_s")
    return None if value is None else float(value)


def file_live(results: dict[str, Any], report: LiveReport) -> None:
    """The live rounds' report, filed under `latency`, `cost`, `live` (the stateful engine's swaps),
    `live_closing` (the closing engine's), `restart` and `profile`."""
    by_side: dict[str, dict[str, list[float | None]]] = {}
    for entry in report.rounds:
        for side in SIDES:
            steady = (entry.get(side) or {}).get("steady") or {}
            for key in ("p50_s", "p99_s"):
                by_side.setdefault(side, {}).setdefault(key, []).append(steady.get(key))
    results["latency"] = {
        "method": "per round, the result latency of the first windows that start after the first result's window",
        **{side: {key: spread(values) for key, values in measures.items()} for side, measures in by_side.items()},
        # Each engine's steady p99 over plain Spark's in the same round, then the spread over rounds.
        "p99_over_plain": {
            side: paired_ratios((_steady_p99(entry, side), _steady_p99(entry, PLAIN)) for entry in report.rounds)
            for side in ENGINES
        },
        "rounds": report.rounds,
    }
    if report.cost:
        results["cost"] = {
            "method": (
                "CPU seconds of the Spark JVM (with its children) and the driver's Python process per 1,000 events, "
                "over a measured interval at each rate; the Kafka broker and Redis apart"
            ),
            **report.cost,
        }
    for side, live in report.live.items():
        results[live_key(side)] = live
    if report.restart is not None:
        results["restart"] = report.restart
    if report.errors:
        results["live_errors"] = report.errors
    profile = results.setdefault("profile", {})
    profile.setdefault("stages", {})["steady"] = {
        side: medians_ms(samples) for side, samples in report.stage_samples.items() if samples
    }
    profile.setdefault("spark_durations_ms", {})["steady"] = _round_durations(report.rounds)
    profile.setdefault("codegen", {})["steady"] = _round_codegen(report.rounds)


def _combine_durations(entries: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, float]]]:
    """(side, {query: {key: median ms}}) per round -> side -> query -> key -> median over rounds."""
    gathered: dict[str, dict[str, dict[str, list[float]]]] = {}
    for side, by_query in entries:
        for query, durations in by_query.items():
            for key, value in durations.items():
                gathered.setdefault(side, {}).setdefault(query, {}).setdefault(key, []).append(float(value))
    return {
        side: {q: {k: round(statistics.median(v), 1) for k, v in keys.items()} for q, keys in by_query.items()}
        for side, by_query in gathered.items()
    }


def _round_durations(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    entries = []
    for entry in rounds:
        for side in SIDES:
            durations = ((entry.get(side) or {}).get("profile") or {}).get("spark_durations_ms")
            if durations:
                entries.append((side, durations))
    return _combine_durations(entries)


def _drain_durations(runs: list[dict[str, Any]]) -> dict[str, Any]:
    entries = [
        (run["side"], {q: info["batch_durations_ms"] for q, info in (run.get("queries") or {}).items()})
        for run in runs
        if "error" not in run
    ]
    return _combine_durations(entries)


def _sum_codegen(entries: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Any]:
    totals: dict[str, dict[str, float]] = {}
    for side, got in entries:
        if not got:
            continue
        total = totals.setdefault(side, {"batches": 0, "compilations": 0, "compile_s": 0.0})
        for key in total:
            total[key] += got[key]
    return {
        side: {
            **t,
            "compile_s": round(t["compile_s"], 3),
            "compilations_per_batch": round(t["compilations"] / t["batches"], 2) if t["batches"] else None,
            "compile_ms_per_batch": round(t["compile_s"] * 1000 / t["batches"], 1) if t["batches"] else None,
        }
        for side, t in totals.items()
    }


def _round_codegen(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    entries = []
    for entry in rounds:
        for side in SIDES:
            entries.append((side, ((entry.get(side) or {}).get("profile") or {}).get("codegen")))
    return _sum_codegen(entries)


def _drain_codegen(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return _sum_codegen([(run["side"], run.get("codegen")) for run in runs])


def save(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
