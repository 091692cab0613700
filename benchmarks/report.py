"""The summary: headline ratios, the issue's targets (met / not met, with the number), and the
table printed at the end of a run (the README's Performance section shows the same table)."""

from __future__ import annotations

from typing import Any


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _target(value: Any, met: bool | None, goal: str) -> dict[str, Any]:
    return {"value": value, "goal": goal, "met": met}


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """Each target of issue #11; `met` is None when the section did not produce the number."""
    ratio = _get(results, "throughput", "throughput_ratio")
    steady = _get(results, "live", "latency", "steady", "p99_s")
    during = _get(results, "live", "latency", "during_swap", "p99_s")
    over_floor = _get(results, "live", "swap", "overhead_over_floor_s")
    gap_steady = _get(results, "live", "output_gap_s", "steady_max")
    gap_swap = _get(results, "live", "output_gap_s", "around_swap_max")
    audit = _get(results, "live", "audit") or {}
    lost = _get(results, "live", "coverage", "events_lost")
    restart_cov = _get(results, "restart", "coverage") or {}
    restart_gap = _get(results, "restart", "output_gap_s", "around_restart_max")
    flat = _get(results, "memory", "flat")
    p99_ratio = round(during / steady, 3) if during is not None and steady else None
    losses = (audit.get("missing_windows"), audit.get("duplicate_results"), audit.get("overlapping_windows"), lost)
    return {
        "throughput_ratio": _target(ratio, None if ratio is None else ratio >= 0.8, ">= 0.8"),
        "p99_swap_over_steady": _target(p99_ratio, None if p99_ratio is None else p99_ratio <= 1.25, "<= 1.25"),
        "steady_p99_s": _target(
            steady, None if steady is None else steady <= 2.0, "<= 2 s after the window could close"
        ),
        "swap_overhead_over_floor_s": _target(over_floor, None if over_floor is None else over_floor <= 3.0, "<= 3 s"),
        "output_gap_vs_steady_s": _target(
            {"around_swap": gap_swap, "steady": gap_steady, "restart": restart_gap},
            None if gap_swap is None or gap_steady is None else gap_swap <= gap_steady,
            "gap around the swap <= steady-state gap",
        ),
        "exactly_once": _target(
            {
                "missing_windows": losses[0],
                "duplicate_results": losses[1],
                "overlapping_windows": losses[2],
                "events_lost": losses[3],
                "restart": {k: restart_cov.get(k) for k in ("missing_windows", "incomplete_windows", "events_lost")},
            },
            None if not audit else all(v == 0 for v in losses),
            "0 missing, 0 duplicates (restart shows its losses)",
        ),
        "memory_flat": _target(
            _get(results, "memory", "peak_over_baseline"),
            flat,
            "peak under 2x load or catch-up <= 1.25x warmed-up peak at 1x",
        ),
    }


def table(results: dict[str, Any]) -> str:
    """A Markdown table of the headline numbers (pasted into the README)."""
    rows = [
        ("throughput, plain Spark (ev/s)", _get(results, "throughput", "plain_spark_events_per_s")),
        ("throughput, hotswap (ev/s)", _get(results, "throughput", "hotswap_events_per_s")),
        ("throughput ratio hotswap / plain", _get(results, "throughput_ratio")),
        ("generator send rate (ev/s)", _get(results, "throughput", "generator_send_rate")),
        ("steady p50 / p99 latency (s)", _pair(results, "steady")),
        ("plain Spark steady p50 / p99 latency (s)", _plain_latency(results)),
        ("during-swap p50 / p99 latency (s)", _pair(results, "during_swap")),
        ("p99 during swap / steady p99", _get(results, "p99_swap_over_steady")),
        ("swap total / floor / overhead (s)", _swap(results)),
        ("max output gap: steady / swap (s)", _gaps(results, "live", "steady_max", "around_swap_max")),
        ("max output gap: restart steady / restart (s)", _gaps(results, "restart", "steady_max", "around_restart_max")),
        ("hotswap missing / duplicate / events lost", _losses(results, "live")),
        ("restart missing / incomplete windows / events lost", _restart_losses(results)),
        ("memory: peak under load / warmed-up peak", _get(results, "memory", "peak_over_baseline")),
    ]
    lines = ["| measure | value |", "|---|---|"]
    lines += [f"| {name} | {'n/a' if value is None else value} |" for name, value in rows]
    return "\n".join(lines)


def _pair(results: dict[str, Any], which: str) -> str | None:
    stats = _get(results, "live", "latency", which)
    return f"{stats['p50_s']} / {stats['p99_s']}" if stats else None


def _swap(results: dict[str, Any]) -> str | None:
    swap = _get(results, "live", "swap")
    return f"{swap['total_s']} / {swap['floor_s']} / {swap['overhead_over_floor_s']}" if swap else None


def _gaps(results: dict[str, Any], section: str, a: str, b: str) -> str | None:
    gaps = _get(results, section, "output_gap_s")
    return f"{gaps[a]} / {gaps[b]}" if gaps else None


def _losses(results: dict[str, Any], section: str) -> str | None:
    audit, cov = _get(results, section, "audit"), _get(results, section, "coverage")
    if not audit or not cov:
        return None
    duplicates = audit["duplicate_results"] + audit["overlapping_windows"]
    return f"{audit['missing_windows']} / {duplicates} / {cov['events_lost']}"


def _restart_losses(results: dict[str, Any]) -> str | None:
    cov = _get(results, "restart", "coverage")
    return f"{cov['missing_windows']} / {cov['incomplete_windows']} / {cov['events_lost']}" if cov else None


def _plain_latency(results: dict[str, Any]) -> str | None:
    restart = _get(results, "restart")
    if not isinstance(restart, dict) or "steady_p99_latency_s" not in restart:
        return None
    return f"{restart.get('steady_p50_latency_s')} / {restart['steady_p99_latency_s']}"
