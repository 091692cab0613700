"""The summary: the issues' targets (met / not met, with the number), and the table printed at the end
of a run (the README's Performance section shows the same table).

Every measure taken over rounds is a spread: {median, min, max, n}; the table prints it as
`median [min-max]`, and a target is judged on the median.
"""

from __future__ import annotations

from typing import Any


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _target(value: Any, met: bool | None, goal: str, **extra: Any) -> dict[str, Any]:
    return {"value": value, "goal": goal, "met": met, **extra}


def _median(spread: Any) -> Any:
    return spread.get("median") if isinstance(spread, dict) else spread


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 21's targets first, then issue 11's; `met` is None when no number was produced."""
    ratio = _median(_get(results, "throughput", "throughput_ratio"))
    steady = _median(_get(results, "latency", "hotswap", "p99_s"))
    over_floor = _get(results, "live", "swap", "overhead_over_floor_s")
    same_steady = _get(results, "live", "latency", "steady", "p99_s")
    during = _get(results, "live", "latency", "during_swap", "p99_s")
    gap_steady = _get(results, "live", "output_gap_s", "steady_max")
    gap_swap = _get(results, "live", "output_gap_s", "around_swap_max")
    audit = _get(results, "live", "audit") or {}
    lost = _get(results, "live", "coverage", "events_lost")
    restart_cov = _get(results, "restart", "coverage") or {}
    restart_gap = _get(results, "restart", "output_gap_s", "around_restart_max")
    flat = _get(results, "memory", "flat")
    p99_ratio = round(during / same_steady, 3) if during is not None and same_steady else None
    losses = (audit.get("missing_windows"), audit.get("duplicate_results"), audit.get("overlapping_windows"), lost)
    return {
        "throughput_ratio": _target(
            ratio,
            None if ratio is None else ratio >= 0.7,
            ">= 0.7 (goal 0.8): median of the rounds' hotswap / plain slopes",
            spread=_get(results, "throughput", "throughput_ratio"),
        ),
        "steady_p99_s": _target(
            steady,
            None if steady is None else steady <= 2.0,
            "<= 2 s after the window could close: median of the rounds' hotswap p99",
            spread=_get(results, "latency", "hotswap", "p99_s"),
        ),
        "swap_overhead_over_floor_s": _target(
            over_floor,
            None if over_floor is None else over_floor <= 3.0,
            "<= 3 s: submitted to completed, minus W + lateness - submitted",
        ),
        "control_state_cost_flat": _target(
            _get(results, "control_state", "ratio"),
            _get(results, "control_state", "flat"),
            "a batch's control-state cost with 200 swaps of history within 10 % of one swap's (ratio <= 1.10)",
            median_ms=_get(results, "control_state", "median_ms"),
        ),
        "p99_swap_over_steady": _target(
            p99_ratio,
            None if p99_ratio is None else p99_ratio <= 1.25,
            "<= 1.25 (issue 11; the same segment's steady p99)",
        ),
        "output_gap_vs_steady_s": _target(
            {"around_swap": gap_swap, "steady": gap_steady, "restart": restart_gap},
            None if gap_swap is None or gap_steady is None else gap_swap <= gap_steady,
            "gap around the swap <= steady-state gap (issue 11)",
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
            "peak under 2x load or catch-up <= 1.25x warmed-up peak at 1x (issue 11)",
        ),
    }


def fmt(spread: Any, digits: int = 3) -> str:
    """A spread as `median [min-max]`; a plain number as itself; nothing as n/a."""
    if spread is None:
        return "n/a"
    if isinstance(spread, dict) and "median" in spread:
        m, lo, hi = (spread[k] for k in ("median", "min", "max"))
        if digits == 0:
            return f"{m:,.0f} [{lo:,.0f}-{hi:,.0f}]"
        return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"
    if isinstance(spread, float):
        return f"{spread:.{digits}f}"
    return str(spread)


def _costs(results: dict[str, Any], side: str, key: str) -> str:
    steps = _get(results, "cost", side) or []
    shown = [
        f"{s['target_rate']:,.0f}: {fmt(s.get(key), 3)}{'' if s.get('kept_up', True) else ' (behind)'}" for s in steps
    ]
    return "; ".join(shown) if shown else "n/a"


def _trigger(results: dict[str, Any], side: str) -> str:
    trigger = results.get("trigger") or "default"
    # Runs before the sides were told apart gave both the same trigger, as one string.
    return str(trigger.get(side, "default") if isinstance(trigger, dict) else trigger)


def table(results: dict[str, Any]) -> str:
    """A Markdown table of the headline numbers (pasted into the README)."""
    tp, lat = results.get("throughput") or {}, results.get("latency") or {}
    plain_lat, hot_lat = lat.get("plain_spark") or {}, lat.get("hotswap") or {}
    swap = _get(results, "live", "swap") or {}
    swap2 = _get(results, "live", "swap_at_2x_rate") or {}
    promotion = _get(results, "live", "promotion") or {}
    restart = results.get("restart") or {}
    rows: list[tuple[str, str, str]] = [
        (
            "throughput, slope (ev/s)",
            fmt(tp.get("plain_spark_events_per_s"), 0),
            fmt(tp.get("hotswap_events_per_s"), 0),
        ),
        ("throughput ratio hotswap / plain (per round)", "", fmt(tp.get("throughput_ratio"))),
        ("steady p50 result latency (s)", fmt(plain_lat.get("p50_s")), fmt(hot_lat.get("p50_s"))),
        ("steady p99 result latency (s)", fmt(plain_lat.get("p99_s")), fmt(hot_lat.get("p99_s"))),
        (
            "CPU s per 1,000 events (Spark JVM + driver), by rate",
            _costs(results, "plain_spark", "cpu_s_per_1000_events"),
            _costs(results, "hotswap", "cpu_s_per_1000_events"),
        ),
        (
            "Kafka broker CPU s per 1,000 events, by rate",
            _costs(results, "plain_spark", "kafka_cpu_s_per_1000_events"),
            _costs(results, "hotswap", "kafka_cpu_s_per_1000_events"),
        ),
        (
            "Redis CPU s per 1,000 events, by rate",
            _costs(results, "plain_spark", "redis_cpu_s_per_1000_events"),
            _costs(results, "hotswap", "redis_cpu_s_per_1000_events"),
        ),
        ("swap total / floor / overhead (s)", "", _swap(swap)),
        ("swap phases: s in phase (s after the floor when entered)", "", _phases(swap)),
        ("swap drain: old graph's batch in flight at the marker, batches after it, seen (s)", "", _drain(swap)),
        ("swap at 2x rate total / floor / overhead (s)", "", _swap(swap2)),
        (
            "same change as a promoted shadow: promote to completed / ordinary swap submit to completed (s)",
            "",
            f"{fmt(promotion.get('promote_to_completed_s'))} / {fmt(swap.get('total_s'))}",
        ),
        ("control state per batch, 1 / 200 swaps of history (ms; service + writer)", "", _control(results)),
        ("during-swap p50 / p99 latency (s)", "", _pair(_get(results, "live", "latency", "during_swap"))),
        ("p99 during swap / same segment's steady p99", "", fmt(results.get("p99_swap_over_steady"))),
        (
            "max output gap: steady / around the change (s)",
            _gaps(restart, "steady_max", "around_restart_max"),
            _gaps(results.get("live"), "steady_max", "around_swap_max"),
        ),
        ("missing / duplicate or incomplete / events lost", _restart_losses(restart), _losses(results.get("live"))),
        ("memory: peak under load / warmed-up peak", "", str(_get(results, "memory", "peak_over_baseline") or "n/a")),
        (
            "other work on the machine in steady periods (cores)",
            _elsewhere(lat, "plain_spark"),
            _elsewhere(lat, "hotswap"),
        ),
        ("other work on the machine over the run (cores) / steal", "", _run_elsewhere(results)),
        ("trigger", _trigger(results, "plain_spark"), _trigger(results, "hotswap")),
    ]
    lines = ["| measure | plain Spark | hotswap |", "|---|---|---|"]
    lines += [f"| {name} | {plain or ''} | {hot or ''} |" for name, plain, hot in rows]
    return "\n".join(lines)


def _control(results: dict[str, Any]) -> str:
    medians = _get(results, "control_state", "median_ms")
    if not isinstance(medians, dict) or len(medians) != 2:
        return "n/a"
    one, many = (sum(parts.values()) for parts in medians.values())
    return f"{one:.2f} / {many:.2f} (ratio {_get(results, 'control_state', 'ratio')})"


SPARK_PARTS = ("addBatch", "queryPlanning", "latestOffset", "walCommit", "commitOffsets")  # triggerExecution's parts


def largest_stages(results: dict[str, Any], limit: int = 10) -> str:
    """Per period (steady at 500 ev/s, drain of the backlog), the largest medians in ms: the product's
    stage timings, the parts of Spark's batch time per query, and code generation per batch."""
    lines: list[str] = []
    for period in ("steady", "drain"):
        found: list[tuple[float, str]] = []
        for query, by_stage in (_get(results, "profile", "stages", period) or {}).items():
            for stage, value in by_stage.items():
                found.append((value["median_ms"], f"hotswap {query}: {stage} (stages.timed)"))
        for side, by_query in (_get(results, "profile", "spark_durations_ms", period) or {}).items():
            for query, durations in by_query.items():
                for key in SPARK_PARTS:
                    if key in durations:
                        found.append((durations[key], f"{side} {query}: Spark {key}"))
        for side, got in (_get(results, "profile", "codegen", period) or {}).items():
            if got.get("compile_ms_per_batch") is not None:
                found.append((got["compile_ms_per_batch"], f"{side}: Spark codegen compile per batch (all queries)"))
        found.sort(reverse=True)
        lines.append(f"  {period}:")
        lines += [f"    {ms:9.1f} ms  {what}" for ms, what in found[:limit]] or ["    (none recorded)"]
    return "\n".join(lines)


def _pair(stats: Any) -> str:
    return f"{stats['p50_s']} / {stats['p99_s']}" if isinstance(stats, dict) else "n/a"


def _swap(swap: dict[str, Any]) -> str:
    if not swap:
        return "n/a"
    return f"{swap.get('total_s')} / {swap.get('floor_s')} / {swap.get('overhead_over_floor_s')}"


def _phases(swap: dict[str, Any]) -> str:
    parts = []
    for p in swap.get("phases") or []:
        if p.get("duration_s") is None:
            continue
        after = p.get("after_floor_s")
        parts.append(f"{p['phase']} {p['duration_s']}" + ("" if after is None else f" ({after:+.1f})"))
    return ", ".join(parts) or "n/a"


def _drain(swap: dict[str, Any]) -> str:
    drain = swap.get("drain") if swap else None
    if not drain:
        return "n/a"
    after = ", ".join(f"{b['took_s']}" for b in drain["batches_after_marker"]) or "none"
    return f"{drain['in_flight_s']}, [{after}], {drain['seen_s']} (total {drain['total_s']})"


def _gaps(section: Any, a: str, b: str) -> str:
    gaps = _get(section, "output_gap_s")
    return f"{gaps[a]} / {gaps[b]}" if gaps else "n/a"


def _losses(section: Any) -> str:
    audit, cov = _get(section, "audit"), _get(section, "coverage")
    if not audit or not cov:
        return "n/a"
    duplicates = audit["duplicate_results"] + audit["overlapping_windows"]
    return f"{audit['missing_windows']} / {duplicates} / {cov['events_lost']}"


def _restart_losses(restart: Any) -> str:
    cov = _get(restart, "coverage")
    return f"{cov['missing_windows']} / {cov['incomplete_windows']} / {cov['events_lost']}" if cov else "n/a"


def _elsewhere(latency: dict[str, Any], side: str) -> str:
    """Cores busy with work that is not the benchmark's, in each round's steady period."""
    values = [
        ((entry.get(side) or {}).get("elsewhere") or {}).get("others_cores") for entry in latency.get("rounds") or []
    ]
    shown = [f"{v:.2f}" for v in values if v is not None]
    return " / ".join(shown) if shown else "n/a"


def _run_elsewhere(results: dict[str, Any]) -> str:
    got = _get(results, "machine", "elsewhere_during_run") or {}
    return f"{got.get('others_cores')} / {got.get('steal_cores')}" if got else "n/a"
