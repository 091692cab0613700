"""The PNG next to the JSON: result latency over time with the swap phases shaded (hotswap, one
panel per execution-graph engine), the same for stop-and-restart, events processed over time in
each throughput run, and CPU per 1,000 events by rate for every contender."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on a CI box or a server
import itertools

import matplotlib.pyplot as plt

from benchmarks.common import ENGINES, SIDES, live_key

PHASE_COLOURS = ["#fde0dd", "#fcc5c0", "#fa9fb5", "#f768a1", "#dd3497", "#ae017e", "#7a0177"]


def _latency(ax: Any, series: list[Any], t0: int, title: str) -> None:
    by_query: dict[str, tuple[list[float], list[float]]] = {}
    for emit_ms, latency_s, query_id in series:
        xs, ys = by_query.setdefault(str(query_id), ([], []))
        xs.append((emit_ms - t0) / 1000)
        ys.append(latency_s)
    for query_id, (xs, ys) in by_query.items():
        ax.scatter(xs, ys, s=4, label=query_id)
    ax.set_title(title)
    ax.set_ylabel("result latency (s)\nemit - (window end + lateness)")
    ax.set_xlabel("seconds since the first result")


def _shade_swap(ax: Any, swap: dict[str, Any], t0: int, label: str) -> None:
    at = sorted(swap.get("phase_at_ms", {}).items(), key=lambda item: item[1])
    for i, ((name, start), (_, end)) in enumerate(itertools.pairwise(at)):
        ax.axvspan(
            (start - t0) / 1000,
            (end - t0) / 1000,
            color=PHASE_COLOURS[i % len(PHASE_COLOURS)],
            alpha=0.5,
            label=f"{label}: {name}" if label else None,
        )


def draw(results: dict[str, Any], path: Path) -> None:
    panels = len(ENGINES) + 3
    fig, all_axes = plt.subplots(panels, 1, figsize=(11, 4 * panels))
    for ax, side in zip(all_axes, ENGINES, strict=False):
        live = results.get(live_key(side)) or {}
        if live.get("series"):
            t0 = live["series"][0][0]
            _latency(ax, live["series"], t0, f"{side}: result latency, swap phases shaded (second: rate x2)")
            _shade_swap(ax, live["swap"], t0, "swap")
            _shade_swap(ax, live["swap_at_2x_rate"], t0, "")
            ax.legend(fontsize=7, loc="upper left", ncol=2)
    restart_ax, throughput_ax, cost_ax = all_axes[len(ENGINES) :]
    restart = results.get("restart") or {}
    if restart.get("series"):
        t0 = restart["series"][0][0]
        _latency(restart_ax, restart["series"], t0, "plain Spark stop-and-restart: result latency")
        start = (restart["stop_at_ms"] - t0) / 1000
        end = ((restart.get("first_new_result_at_ms") or restart["stop_at_ms"]) - t0) / 1000
        restart_ax.axvspan(start, end, color="#fcc5c0", alpha=0.6, label="stop -> first new result")
        restart_ax.legend(fontsize=7, loc="upper left")
    throughput = results.get("throughput") or {}
    for run in throughput.get("runs", []):
        series = run.get("series") or []
        if series:
            t0 = series[0][0]
            xs = [(t - t0) / 1000 for t, _ in series]
            ys = [rows for _, rows in series]
            rate = run.get("events_per_s")
            label = f"{run['side']} round {run.get('round')} ({rate:,} ev/s)" if rate else run["side"]
            throughput_ax.plot(xs, ys, marker=".", label=label)
    throughput_ax.set_title("throughput: events counted by the results while draining the backlog (slope over 10-90 %)")
    throughput_ax.set_xlabel("seconds since the first results")
    throughput_ax.set_ylabel("events")
    throughput_ax.legend(fontsize=7)
    cost = results.get("cost") or {}
    for side in SIDES:
        steps = [s for s in cost.get(side) or [] if s.get("cpu_s_per_1000_events") is not None]
        if steps:
            cost_ax.plot(
                [s["sent_rate"] for s in steps], [s["cpu_s_per_1000_events"] for s in steps], marker="o", label=side
            )
    cost_ax.set_title("cost: CPU seconds (Spark JVM + driver) per 1,000 events, by event rate")
    cost_ax.set_xlabel("events per second")
    cost_ax.set_ylabel("CPU s / 1,000 events")
    cost_ax.set_xscale("log")
    cost_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
