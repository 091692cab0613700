"""Sections 1 and 2 (hotswap side): result latency in steady state and during a live swap, the
swap's phases against its floor, the output gap around it, and the audit. A second swap runs
while the event rate doubles, for the memory section.

Result latency = the result's Kafka timestamp (set by Spark's Kafka producer from the wall clock
when the result is sent; the ResultWriter writes no timestamp column) minus the moment its window
could first close (window end + lateness). The generator runs with event time = wall time.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from benchmarks.common import (
    CHANGED,
    LATENESS_MS,
    QUERY,
    WINDOW_MS,
    Clock,
    Emitted,
    Load,
    batch_durations,
    coverage,
    live_spec,
    percentile,
    read_emitted,
    settings_for,
    source_counts,
    wait_for,
    window_gaps,
)
from benchmarks.memory import MemorySampler
from hotswap.contract.journal import SwapRecord
from hotswap.contract.models import now_ms
from hotswap.execution_graph.source import load_query_source
from hotswap.executor.control.controller import Executor
from hotswap.executor.control.topics import Topics
from hotswap.executor.operator.client import Client, redis_client
from hotswap.service_sink.audit import audit, read_results


@dataclass(frozen=True)
class LiveShape:
    rate: float  # events per second
    steady_s: float  # steady state before the swap
    after_s: float  # after the swap, before the doubled-rate swap


def latency_ms(e: Emitted) -> float:
    return float(e.emit_ms - (e.window_end + LATENESS_MS))


def stats(values: list[float]) -> dict[str, Any]:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "results": len(values),
        "p50_s": None if p50 is None else round(p50 / 1000, 3),
        "p99_s": None if p99 is None else round(p99 / 1000, 3),
    }


def phase_times(swap: SwapRecord) -> dict[str, Any]:
    """Seconds per journal phase, the total, and the floor: the wait for the cut boundary W plus
    the lateness, i.e. W + lateness - submit (event time = wall time here), below which no swap
    can complete because the old query's last window cannot close sooner."""
    at = {p.name.value: p.at for p in swap.phases}
    phases = {f"{a}->{b}": round((at[b] - at[a]) / 1000, 3) for a, b in itertools.pairwise(at)}
    total = (at["completed"] - at["submitted"]) / 1000 if "completed" in at else None
    floor = (swap.cut_window_end + LATENESS_MS - at["submitted"]) / 1000 if swap.cut_window_end is not None else None
    return {
        "state": swap.state.value,
        "submitted_at_ms": at.get("submitted"),
        "completed_at_ms": at.get("completed"),
        "phase_at_ms": at,
        "phases_s": phases,
        "total_s": None if total is None else round(total, 3),
        "cut_window_end_ms": swap.cut_window_end,
        "floor_s": None if floor is None else round(floor, 3),
        "overhead_over_floor_s": None if total is None or floor is None else round(total - floor, 3),
    }


def run_live(spark: SparkSession, shape: LiveShape, clock: Clock, memory: MemorySampler) -> dict[str, Any]:
    settings = settings_for("live")
    Topics(settings).ensure(settings.source_topic, settings.source_partitions)
    client = Client(settings, redis_client(settings))
    executor = Executor(settings, spark, redis_client(settings))
    stop = threading.Event()
    thread = threading.Thread(target=executor.run, args=(load_query_source(QUERY), stop), daemon=True)
    thread.start()
    load = extra = None
    errors: list[str] = []
    try:
        wait_for(executor.ready.is_set, 300, "executor start")
        load_start_ms = now_ms()
        load = Load(settings, live_spec(shape.rate, seed=2)).start()
        clock.step(f"live: executor ready; load {shape.rate:.0f} ev/s over 1,000 keys; waiting for first results")
        memory.phase = "steady"

        def emitted() -> bool:
            # The first window that started after the load began has closed (a watermark of 0
            # from the graph's first, empty batch does not count).
            graph = client.status().graphs.get(QUERY.stem)
            progress = graph.progress if graph is not None else None
            committed = progress.committed_watermark if progress is not None else None
            return committed is not None and committed >= load_start_ms + 2 * WINDOW_MS

        wait_for(emitted, 120, "first results")
        clock.step(f"live: first results; steady state for {shape.steady_s:.0f}s")
        time.sleep(shape.steady_s)
        durations = batch_durations(spark)

        memory.phase = "swap"
        swap = client.submit(CHANGED, CHANGED.stem)
        clock.step(f"live: submitted swap {QUERY.stem} -> {CHANGED.stem}")
        done = _finish(client, swap.id, errors)
        clock.step(f"live: swap {done.state.value}; {shape.after_s:.0f}s after it")
        memory.phase = "after_swap"
        time.sleep(shape.after_s)

        # The event rate doubles (a second generator, other seed) while another swap runs.
        memory.phase = "swap_at_2x_rate"
        extra = Load(settings, live_spec(shape.rate, seed=3)).start()
        swap2 = client.submit(QUERY, f"{QUERY.stem}_2")
        clock.step(f"live: rate doubled to {2 * shape.rate:.0f} ev/s; submitted swap back")
        done2 = _finish(client, swap2.id, errors)
        extra.halt()
        memory.phase = "after_swap_2x"
        clock.step(f"live: swap at 2x rate {done2.state.value}; letting the last windows close")
        time.sleep(LATENESS_MS / 1000 + 3)
    finally:
        for running in (extra, load):
            if running is not None:
                running.halt()
        memory.phase = "idle"
        stop.set()
        thread.join(timeout=120)
    clock.step("live: reading results and the source back")
    results = read_emitted(settings)
    counts = source_counts(settings)
    summary = summarize(results, counts, done, done2, load_start_ms, audit(read_results(settings, timeout_s=60)))
    summary["errors"] = errors
    summary["steady_batch_durations"] = durations
    return summary


def _finish(client: Client, swap_id: str, errors: list[str]) -> SwapRecord:
    """The swap's record once terminal; a failed or slow swap is recorded, not fatal: the latency
    numbers around it are still worth having."""
    try:
        return client.wait_until_done(swap_id, 240)
    except Exception as exc:  # noqa: BLE001 - SwapFailed or TimeoutExpired; both end up in the report
        errors.append(f"swap {swap_id}: {type(exc).__name__}: {exc}")
        return client.journal.get(swap_id)


def summarize(
    results: list[Emitted],
    counts: dict[int, int],
    swap: SwapRecord,
    swap2: SwapRecord,
    load_start_ms: int,
    checked: Any,
) -> dict[str, Any]:
    first, second = phase_times(swap), phase_times(swap2)
    submit, completed = first["submitted_at_ms"], first["completed_at_ms"] or first["submitted_at_ms"]
    # Steady state: results emitted before the first submit, of windows that started after the
    # load did (the first window may be partial; its latency is still real, but keep it clean).
    steady = [latency_ms(e) for e in results if e.emit_ms < submit and e.window_start >= load_start_ms]
    during = [latency_ms(e) for e in results if submit <= e.emit_ms <= completed]
    s2, c2 = second["submitted_at_ms"], second["completed_at_ms"] or second["submitted_at_ms"]
    during2 = [latency_ms(e) for e in results if s2 <= e.emit_ms <= c2]
    return {
        "latency": {"steady": stats(steady), "during_swap": stats(during), "during_swap_at_2x_rate": stats(during2)},
        "swap": first,
        "swap_at_2x_rate": second,
        "output_gap_s": {
            "steady_max": window_gaps(results, load_start_ms, submit - 1),
            "around_swap_max": window_gaps(results, submit, completed + 5_000),
            "around_swap_at_2x_rate_max": window_gaps(results, s2, c2 + 5_000),
        },
        "audit": {
            "results": checked.results,
            "windows_by_query": checked.windows_by_query,
            "missing_windows": len(checked.missing_windows),
            "duplicate_results": checked.duplicate_results,
            "overlapping_windows": checked.overlapping_windows,
        },
        "coverage": coverage(results, counts),
        "series": [
            (e.emit_ms, round(latency_ms(e) / 1000, 3), e.query_id) for e in results[:: max(1, len(results) // 3000)]
        ],
    }
