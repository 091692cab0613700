"""The PNG next to the JSON: result latency over time with the swap phases shaded (hotswap), the
same for stop-and-restart, events processed over time in each throughput run, and CPU per 1,000
events by rate for both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on a CI box or a server
import itertools

import matplotlib.pyplot as plt

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
    fig, axes = plt.subplots(4, 1, figsize=(11, 16))
    live = results.get("live") or {}
    if live.get("series"):
        t0 = live["series"][0][0]
        _latency(axes[0], live["series"], t0, "hotswap: result latency, swap phases shaded (second: rate x2)")
        _shade_swap(axes[0], live["swap"], t0, "swap")
        _shade_swap(axes[0], live["swap_at_2x_rate"], t0, "")
        axes[0].legend(fontsize=7, loc="upper left", ncol=2)
    restart = results.get("restart") or {}
    if restart.get("series"):
        t0 = restart["series"][0][0]
        _latency(axes[1], restart["series"], t0, "plain Spark stop-and-restart: result latency")
        start = (restart["stop_at_ms"] - t0) / 1000
        end = ((restart.get("first_new_result_at_ms") or restart["stop_at_ms"]) - t0) / 1000
        axes[1].axvspan(start, end, color="#fcc5c0", alpha=0.6, label="stop -> first new result")
        axes[1].legend(fontsize=7, loc="upper left")
    throughput = results.get("throughput") or {}
    for run in throughput.get("runs", []):
        series = run.get("series") or []
        if series:
            t0 = series[0][0]
            xs = [(t - t0) / 1000 for t, _ in series]
            ys = [rows for _, rows in series]
            rate = run.get("events_per_s")
            label = f"{run['side']} round {run.get('round')} ({rate:,} ev/s)" if rate else run["side"]
            axes[2].plot(xs, ys, marker=".", label=label)
    axes[2].set_title("throughput: events counted by the results while draining the backlog (slope over 10-90 %)")
    axes[2].set_xlabel("seconds since the first results")
    axes[2].set_ylabel("events")
    axes[2].legend(fontsize=7)
    cost = results.get("cost") or {}
    for side in ("plain_spark", "hotswap"):
        steps = [s for s in cost.get(side) or [] if s.get("cpu_s_per_1000_events") is not None]
        if steps:
            axes[3].plot(
                [s["sent_rate"] for s in steps], [s["cpu_s_per_1000_events"] for s in steps], marker="o", label=side
            )
    axes[3].set_title("cost: CPU seconds (Spark JVM + driver) per 1,000 events, by event rate")
    axes[3].set_xlabel("events per second")
    axes[3].set_ylabel("CPU s / 1,000 events")
    axes[3].set_xscale("log")
    axes[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
