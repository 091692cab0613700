"""`make bench` / `python -m benchmarks.run [--quick]`: the cost of the hot-swap layer and of a swap,
beside plain Spark and stop-and-restart.

Runs its own embedded stack (ports 29092/29093/26379, under .hotswap/bench), then, in order:
1. and 2. a live hotswap run (latency steady / during a swap, swap phases against the floor, output
   gap, audit; then a second swap while the event rate doubles), and the same change made by
   stop-and-restart of a plain Spark query;
3. throughput: drain rate of a pre-loaded backlog, plain Spark and hotswap alternating;
4. memory: peak RSS per process and phase, sampled all along.
Writes bench/results/<timestamp>.json and a PNG beside it. A section that fails is recorded with
its error and the rest still runs: a partial report beats none.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import RESULTS_DIR, Clock, settings_for
from benchmarks.latency import LiveShape, run_live
from benchmarks.memory import MemorySampler
from benchmarks.plot import draw
from benchmarks.report import table, targets
from benchmarks.restart import run_restart
from benchmarks.throughput import run_throughput
from hotswap.executor.control.spark_session import build_spark_session
from hotswap.executor.logs import configure_logging
from hotswap.executor.stack import EmbeddedStack


def machine() -> dict[str, Any]:
    def out(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=10).stdout.strip()
        except OSError:
            return ""

    return {"nproc": out("nproc"), "free_g": out("free", "-g")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="shorter runs (under 5 minutes on 2 cores)")
    args = parser.parse_args()
    quick: bool = args.quick
    configure_logging("console", "warning")
    clock = Clock()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    json_path, png_path = RESULTS_DIR / f"{stamp}.json", RESULTS_DIR / f"{stamp}.png"
    results: dict[str, Any] = {"mode": "quick" if quick else "full", "started": stamp, "machine": machine()}

    base = settings_for("stack")
    stack = EmbeddedStack(base)
    clock.step("stack: starting Kafka and Redis on 29092/26379")
    stack.up()
    kafka_pid = next((s.pid for s in stack.status() if s.name == "kafka"), None)
    memory = MemorySampler(kafka_pid).start()
    clock.step("spark: starting the session")
    spark = build_spark_session(base)
    rate = 500.0 if quick else 1_000.0

    def section(name: str, run: Callable[[], dict[str, Any]]) -> None:
        clock.step(f"{name}: start")
        try:
            results[name] = run()
        except Exception as exc:  # noqa: BLE001 - record it and go on with the next section
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        clock.step(f"{name}: done")
        save(results, json_path)

    try:
        section(
            "live", lambda: run_live(spark, LiveShape(rate, 30 if quick else 60, 5 if quick else 30), clock, memory)
        )
        section("restart", lambda: run_restart(spark, rate, 15 if quick else 60, 20 if quick else 40, clock))
        section(
            "throughput",
            lambda: run_throughput(
                spark, 100_000 if quick else 1_000_000, 1 if quick else 2, 240 if quick else 900, clock, memory
            ),
        )
    finally:
        memory.stop()
        spark.stop()
        stack.down()
    results["memory"] = memory.summary()
    if quick:
        results["memory"]["backlog_1m_catch_up"] = "skipped in QUICK mode"
    results["throughput_ratio"] = (results.get("throughput") or {}).get("throughput_ratio")
    live = (results.get("live") or {}).get("latency") or {}
    steady, during = (live.get("steady") or {}).get("p99_s"), (live.get("during_swap") or {}).get("p99_s")
    results["p99_swap_over_steady"] = round(during / steady, 3) if during is not None and steady else None
    results["targets"] = targets(results)
    results["elapsed_s"] = round(clock.elapsed(), 1)
    save(results, json_path)
    try:
        draw(results, png_path)
    except Exception:  # noqa: BLE001 - the numbers are saved; a plot failure must not hide them
        traceback.print_exc()
    clock.step(f"wrote {json_path} and {png_path.name}")
    print(table(results))
    print(json.dumps(results["targets"], indent=2))


def save(results: dict[str, Any], path: Any) -> None:
    path.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
