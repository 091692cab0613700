"""The summary: the issues' targets (met / not met, with the number), each execution-graph engine
against the issue's goals, and the tables printed at the end of a run (the README's Performance
section shows the same table): the headline measures with a column per contender, then the goals
with a column per engine.

Every measure taken over rounds is a spread: {median, min, max, n}; the table prints it as
`median [min-max]`, and a target is judged on the median.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.common import ENGINES, PLAIN, SIDES, live_key
from benchmarks.measures import one_value, ratio, tasks_over_rounds

HEADINGS = {PLAIN: "plain Spark", "hotswap": "hotswap (stateful)", "hotswap_closing": "hotswap (closing)"}


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
    throughput = _median(_get(results, "throughput", "throughput_ratio"))
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
            throughput,
            None if throughput is None else throughput >= 0.7,
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


def _goal(measured: Any, at_least: bool, limit: float, how: str) -> dict[str, Any]:
    """A goal judged on the median of a spread (or on a single number); `met` None when unmeasured."""
    value = _median(measured)
    met = None if value is None else (value >= limit if at_least else value <= limit)
    goal = f"{'>=' if at_least else '<='} {limit:g}: {how}"
    return {"value": value, "goal": goal, "met": met, **({"spread": measured} if isinstance(measured, dict) else {})}


def p99_swap_over_steady(results: dict[str, Any], side: str) -> float | None:
    """p99 of the results emitted during a hotswap side's first swap over its segment's steady p99."""
    return ratio(
        _get(results, live_key(side), "latency", "during_swap", "p99_s"),
        _get(results, live_key(side), "latency", "steady", "p99_s"),
    )


def engine_goals(results: dict[str, Any], side: str) -> dict[str, Any]:
    """The issue's goals for one hotswap engine (`side`), each {value, goal, met}: throughput, steady
    p99 against plain Spark's and on its own, p99 during a swap against the steady p99, and the swap
    over its floor. Measures over rounds are judged on their median."""
    live = results.get(live_key(side)) or {}
    # A run from before the engines were told apart has the stateful engine's ratio under its old name.
    throughput = _get(results, "throughput", "throughput_ratios", side)
    if throughput is None and side == "hotswap":
        throughput = _get(results, "throughput", "throughput_ratio")
    return {
        "throughput_ratio": _goal(throughput, True, 0.8, "median of the rounds' slope over plain Spark's"),
        "steady_p99_over_plain": _goal(
            _get(results, "latency", "p99_over_plain", side), False, 1.5, "median of the rounds' p99 over plain Spark's"
        ),
        "steady_p99_s": _goal(_get(results, "latency", side, "p99_s"), False, 2.0, "median of the rounds' p99 (s)"),
        "p99_swap_over_steady": _goal(
            p99_swap_over_steady(results, side), False, 1.25, "p99 during the swap over the same segment's steady p99"
        ),
        "swap_over_floor_s": _goal(
            _get(live, "swap", "overhead_over_floor_s"), False, 2.0, "submitted to completed, minus W + lateness (s)"
        ),
    }


def engine_summary(results: dict[str, Any], side: str) -> dict[str, Any]:
    """One engine at a glance (`engines.<side>` in the JSON): its engine and graph topic partitions as
    each graph recorded and Kafka reported them, the Spark tasks each execution-graph batch ran in the
    steady periods and in the drains (`measures.tasks_over_rounds`), and the issue's goals."""
    periods: dict[str, list[dict[str, Any]]] = {
        "steady": [_get(entry, side, "profile", "graphs") or {} for entry in _get(results, "latency", "rounds") or []],
        "drain": [
            run.get("graphs") or {} for run in _get(results, "throughput", "runs") or [] if run.get("side") == side
        ],
    }
    graphs = [graph for measured in periods.values() for by_role in measured for graph in by_role.values()]
    return {
        "graph_engine": one_value(graph.get("engine") for graph in graphs),
        "graph_topic_partitions": one_value(graph.get("topic_partitions") for graph in graphs),
        "graph_tasks_per_batch": {
            period: tasks_over_rounds(graph.get("tasks") or {} for by_role in measured for graph in by_role.values())
            for period, measured in periods.items()
        },
        "p99_swap_over_steady": p99_swap_over_steady(results, side),
        "goals": engine_goals(results, side),
    }


GOAL_ROWS = (
    ("throughput_ratio", "throughput / plain Spark's, per round (goal >= 0.8)"),
    ("steady_p99_over_plain", "steady p99 / plain Spark's p99, per round (goal <= 1.5)"),
    ("steady_p99_s", "steady p99 result latency, s (goal <= 2.0)"),
    ("p99_swap_over_steady", "p99 during a swap / steady p99 (goal <= 1.25)"),
    ("swap_over_floor_s", "swap over its floor, s (goal <= 2)"),
)


def goals_table(results: dict[str, Any]) -> str:
    """A Markdown table of the issue's goals, a column per engine: the number, and met or not."""
    goals = {side: _get(results, "engines", side, "goals") or engine_goals(results, side) for side in ENGINES}
    lines = [
        "| goal | " + " | ".join(HEADINGS.get(side, side) for side in ENGINES) + " |",
        "|---|" + "---|" * len(ENGINES),
    ]
    for key, name in GOAL_ROWS:
        cells = []
        for side in ENGINES:
            got = goals[side].get(key) or {}
            verdict = {True: "met", False: "not met", None: "not measured"}[got.get("met")]
            cells.append(f"{fmt(got.get('spread', got.get('value')))} ({verdict})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    """A Markdown table of the headline numbers, a column per contender (pasted into the README).
    What belongs to the run as a whole (control state, memory, other work over the run) sits in the
    stateful engine's column, as it did before there were two engines."""
    tp, lat = results.get("throughput") or {}, results.get("latency") or {}
    restart = results.get("restart") or {}

    def each(cell: Callable[[str], str], plain: str = "") -> list[str]:
        """A row's cells: plain Spark's (given, or blank), then `cell(side)` for each engine."""
        return [plain, *(cell(side) for side in ENGINES)]

    def live(side: str, *path: str) -> Any:
        return _get(results, live_key(side), *path)

    def ratio_of(side: str) -> Any:
        got = _get(tp, "throughput_ratios", side)
        return tp.get("throughput_ratio") if got is None and side == "hotswap" else got

    def promoted(side: str) -> str:
        promotion = live(side, "promotion") or {}
        return f"{fmt(promotion.get('promote_to_completed_s'))} / {fmt(live(side, 'swap', 'total_s'))}"

    def whole_run(value: str) -> list[str]:
        return ["", value, *([""] * (len(ENGINES) - 1))]

    rows: list[tuple[str, list[str]]] = [
        ("throughput, slope (ev/s)", [fmt(tp.get(f"{side}_events_per_s"), 0) for side in SIDES]),
        ("throughput ratio / plain Spark (per round)", each(lambda side: fmt(ratio_of(side)))),
        ("steady p50 result latency (s)", [fmt(_get(lat, side, "p50_s")) for side in SIDES]),
        ("steady p99 result latency (s)", [fmt(_get(lat, side, "p99_s")) for side in SIDES]),
        ("steady p99 / plain Spark's p99 (per round)", each(lambda side: fmt(_get(lat, "p99_over_plain", side)))),
        (
            "CPU s per 1,000 events (Spark JVM + driver), by rate",
            [_costs(results, side, "cpu_s_per_1000_events") for side in SIDES],
        ),
        (
            "Kafka broker CPU s per 1,000 events, by rate",
            [_costs(results, side, "kafka_cpu_s_per_1000_events") for side in SIDES],
        ),
        (
            "Redis CPU s per 1,000 events, by rate",
            [_costs(results, side, "redis_cpu_s_per_1000_events") for side in SIDES],
        ),
        (
            "execution graph topic partitions",
            each(lambda side: fmt(_get(results, "engines", side, "graph_topic_partitions"))),
        ),
        (
            "Spark tasks per execution-graph batch, steady and drain: median batch (largest batch), over rounds",
            each(lambda side: _tasks(results, side)),
        ),
        ("swap total / floor / overhead (s)", each(lambda side: _swap(live(side, "swap") or {}))),
        (
            "swap phases: s in phase (s after the floor when entered)",
            each(lambda side: _phases(live(side, "swap") or {})),
        ),
        (
            "swap drain: old graph's batch in flight at the marker, batches after it, seen (s)",
            each(lambda side: _drain(live(side, "swap") or {})),
        ),
        ("swap at 2x rate total / floor / overhead (s)", each(lambda side: _swap(live(side, "swap_at_2x_rate") or {}))),
        (
            "same change as a promoted shadow: promote to completed / ordinary swap submit to completed (s)",
            each(promoted),
        ),
        ("control state per batch, 1 / 200 swaps of history (ms; service + writer)", whole_run(_control(results))),
        ("sink write per batch, median (p90), ms: kafka / postgres / delta", whole_run(_sinks(results))),
        ("during-swap p50 / p99 latency (s)", each(lambda side: _pair(live(side, "latency", "during_swap")))),
        (
            "p99 during swap / same segment's steady p99",
            each(lambda side: fmt(p99_swap_over_steady(results, side))),
        ),
        (
            "max output gap: steady / around the change (s)",
            each(
                lambda side: _gaps(results.get(live_key(side)), "steady_max", "around_swap_max"),
                _gaps(restart, "steady_max", "around_restart_max"),
            ),
        ),
        (
            "missing / duplicate or incomplete / events lost",
            each(lambda side: _losses(results.get(live_key(side))), _restart_losses(restart)),
        ),
        (
            "memory: peak under load / warmed-up peak",
            whole_run(str(_get(results, "memory", "peak_over_baseline") or "n/a")),
        ),
        ("other work on the machine in steady periods (cores)", [_elsewhere(lat, side) for side in SIDES]),
        ("other work on the machine over the run (cores) / steal", whole_run(_run_elsewhere(results))),
        ("trigger", [_trigger(results, side) for side in SIDES]),
    ]
    lines = ["| measure | " + " | ".join(HEADINGS.get(side, side) for side in SIDES) + " |"]
    lines.append("|---|" + "---|" * len(SIDES))
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return "\n".join(lines)


def _tasks(results: dict[str, Any], side: str) -> str:
    """Spark tasks per execution-graph batch, steady and drain: the rounds' medians, then (in
    parentheses) the rounds' largest batches, each as `median [min-max]` over the rounds."""
    per_period = _get(results, "engines", side, "graph_tasks_per_batch") or {}
    parts = []
    for period in ("steady", "drain"):
        got = per_period.get(period) or {}
        shown = "n/a" if got.get("median") is None else f"{fmt(got['median'], 1)} ({fmt(got.get('max'), 0)})"
        parts.append(f"{period} {shown}")
    return "; ".join(parts)


def _control(results: dict[str, Any]) -> str:
    medians = _get(results, "control_state", "median_ms")
    if not isinstance(medians, dict) or len(medians) != 2:
        return "n/a"
    one, many = (sum(parts.values()) for parts in medians.values())
    return f"{one:.2f} / {many:.2f} (ratio {_get(results, 'control_state', 'ratio')})"


def _sinks(results: dict[str, Any]) -> str:
    medians, p90 = _get(results, "sinks", "median_ms"), _get(results, "sinks", "p90_ms")
    if not isinstance(medians, dict) or not isinstance(p90, dict):
        return "n/a"
    return " / ".join(f"{fmt(medians.get(s), 0)} ({fmt(p90.get(s), 0)})" for s in ("kafka", "postgres", "delta"))


SPARK_PARTS = ("addBatch", "queryPlanning", "latestOffset", "walCommit", "commitOffsets")  # triggerExecution's parts


def largest_stages(results: dict[str, Any], limit: int = 12) -> str:
    """Per period (steady at 500 ev/s, drain of the backlog), the largest medians in ms: the product's
    stage timings per hotswap side, the parts of Spark's batch time per query, and code generation
    per batch."""
    lines: list[str] = []
    for period in ("steady", "drain"):
        found: list[tuple[float, str]] = []
        for side, by_query in (_get(results, "profile", "stages", period) or {}).items():
            for query, by_stage in by_query.items():
                for stage, value in by_stage.items():
                    found.append((value["median_ms"], f"{side} {query}: {stage} (stages.timed)"))
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
