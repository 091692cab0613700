"""How each number of the benchmark is computed from what was sampled: no Spark, Kafka or Redis here,
so tests/unit/test_bench_numbers.py checks the arithmetic on its own.

- `spread`: the median, min and max of one measure over the rounds.
- `steady_slope`: throughput as the slope of rows processed against time, fitted by least squares
  over the middle of the drain (by default the points between 10 % and 90 % of the rows), so the
  start-up before the first batch and the tail after the last one do not count.
- `emission_points`: rows accounted for over time, read from the results (each result's Kafka
  timestamp and the events it counts), one point per burst of results.
- `change_between` and `per_thousand`: CPU seconds spent (or rows processed) in an interval, from
  cumulative samples, and the cost per 1,000 events.
- `swap_phases`: each recorded journal phase's duration and its time against the swap's floor.
- `drain_batches`: a drain split into the old graph's batch in flight at the marker, the batches
  after it, and the wait until `drained` is recorded.
- `ratio` and `paired_ratios`: one contender against another (plain Spark, or its steady state),
  once or round by round (each round's ratio, then their spread).
- `tasks_per_batch` and `tasks_over_rounds`: the Spark tasks each micro-batch of a query ran, from
  its batches' times and the stages of its jobs; then over the rounds.
- `one_value`: a measure that should not change between rounds (a topic's partitions), or every
  value it took when it did.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def spread(values: Iterable[float | None], digits: int = 3) -> dict[str, Any] | None:
    """Median, min and max of the values measured (None values are rounds that measured nothing)."""
    got = [float(v) for v in values if v is not None]
    if not got:
        return None
    return {
        "median": round(statistics.median(got), digits),
        "min": round(min(got), digits),
        "max": round(max(got), digits),
        "n": len(got),
    }


def fit_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y against x; None for fewer than two distinct x."""
    if len(points) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx


MIN_POINTS = 3


def steady_slope(points: Sequence[tuple[int, int]], low: float = 0.1, high: float = 0.9) -> dict[str, Any]:
    """Rows per second over the steady part of a drain.

    `points` are (epoch ms, cumulative rows), in time order. The fit uses the points whose rows lie
    between `low` and `high` of the total; with fewer than three of them (a drain of few batches) it
    falls back to every point after the first rows, and says so.
    """
    ordered = sorted(points)
    if not ordered:
        return {"events_per_s": None, "points": 0, "fit": "none"}
    total = ordered[-1][1]
    steady = [(t, r) for t, r in ordered if low * total <= r <= high * total]
    fit = f"rows {low:.0%}-{high:.0%}"
    if len(steady) < MIN_POINTS:
        steady, fit = [(t, r) for t, r in ordered if r > 0], "every point (too few in the middle)"
    slope = fit_slope([(t / 1000, float(r)) for t, r in steady])
    return {
        "events_per_s": None if slope is None else round(slope),
        "points": len(steady),
        "fit": fit,
        "from_ms": steady[0][0] if steady else None,
        "to_ms": steady[-1][0] if steady else None,
        "rows": total,
    }


def emission_points(emitted: Iterable[tuple[int, int]], burst_ms: int = 250) -> list[tuple[int, int]]:
    """(Kafka timestamp ms, events counted) of each result -> (time, cumulative events) per burst.

    A batch writes its results within milliseconds: results less than `burst_ms` after the previous
    one join its burst, and the burst's point is its last result with everything counted so far.
    """
    points: list[tuple[int, int]] = []
    total = 0
    last: int | None = None
    for emit_ms, n in sorted(emitted):
        total += n
        if last is not None and emit_ms - last < burst_ms and points:
            points[-1] = (emit_ms, total)
        else:
            points.append((emit_ms, total))
        last = emit_ms
    return points


def batch_points(batches: Iterable[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Spark progress (batch start ms, duration ms, input rows) -> (batch end ms, cumulative rows)."""
    points: list[tuple[int, int]] = []
    total = 0
    for start, duration, rows in sorted(batches):
        total += rows
        points.append((start + duration, total))
    return points


def value_at(points: Sequence[tuple[int, float]], t: int) -> float | None:
    """A cumulative measure at moment `t`, linearly interpolated between the (epoch ms, value) points
    around it; None when `t` is outside them."""
    ordered = sorted(points)
    for (t0, v0), (t1, v1) in itertools.pairwise(ordered):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return None


def change_between(points: Sequence[tuple[int, float]], start_ms: int, end_ms: int) -> float | None:
    """How much a cumulative measure grew between two moments: CPU seconds from cumulative samples,
    rows from the cumulative rows at each batch's end; None when the points do not cover both."""
    a, b = value_at(points, start_ms), value_at(points, end_ms)
    return None if a is None or b is None else max(0.0, b - a)


def per_thousand(cpu_s: float | None, events: int) -> float | None:
    """CPU seconds per 1,000 events."""
    if cpu_s is None or events <= 0:
        return None
    return round(cpu_s * 1000 / events, 4)


def swap_phases(phases: Sequence[tuple[str, int]], cut_window_end: int | None, lateness_ms: int) -> dict[str, Any]:
    """A swap's recorded phases (name, epoch ms, in journal order) against its floor.

    The floor is the moment the old query's last window can close: W + lateness (event time = wall
    time in the benchmark); below `floor_s` after `submitted` no swap can complete. Each phase's
    duration runs from its entry to the next recorded phase; `after_floor_s` says when it was entered,
    relative to the floor (negative: before it). Phase names come from the journal as recorded, so a
    phase added later (such as `deploying` or `retiring`) shows up without a change here.
    """
    if not phases:
        return {"phases": [], "total_s": None, "floor_s": None, "overhead_over_floor_s": None}
    submitted = next((at for name, at in phases if name == "submitted"), phases[0][1])
    completed = next((at for name, at in phases if name == "completed"), None)
    floor_at = None if cut_window_end is None else cut_window_end + lateness_ms
    rows: list[dict[str, Any]] = []
    for i, (name, at) in enumerate(phases):
        following = phases[i + 1][1] if i + 1 < len(phases) else None
        rows.append(
            {
                "phase": name,
                "at_s": round((at - submitted) / 1000, 3),
                "duration_s": None if following is None else round((following - at) / 1000, 3),
                "after_floor_s": None if floor_at is None else round((at - floor_at) / 1000, 3),
            }
        )
    total = None if completed is None else (completed - submitted) / 1000
    floor = None if floor_at is None else (floor_at - submitted) / 1000
    return {
        "phases": rows,
        "total_s": None if total is None else round(total, 3),
        "floor_s": None if floor is None else round(floor, 3),
        "overhead_over_floor_s": None if total is None or floor is None else round(total - floor, 3),
    }


def drain_batches(batches: Iterable[Mapping[str, Any]], marker_ms: int, drained_ms: int) -> dict[str, Any]:
    """Where a drain's time goes, from the old graph's batches (`profile.progress_between` entries).

    The end-of-window marker is written when the swap enters `draining` (`marker_ms`). The old graph
    first finishes the batch it is running (`in_flight_s`), then reads the marker in one batch, and
    Spark evicts the windows through W in the batch after it (a watermark moves at a batch's end);
    `seen_s` is from the end of the last of those batches to `drained` being recorded.
    """

    def ends(entry: Mapping[str, Any]) -> float:
        return float(entry["start_ms"]) + float(entry["durations_ms"].get("triggerExecution", 0.0))

    ordered = sorted(batches, key=lambda b: b["start_ms"])
    in_flight = [b for b in ordered if b["start_ms"] < marker_ms < ends(b)]
    after = [b for b in ordered if marker_ms <= b["start_ms"] and ends(b) <= drained_ms]
    last_end = max((ends(b) for b in after), default=None)
    return {
        "in_flight_s": round((ends(in_flight[-1]) - marker_ms) / 1000, 3) if in_flight else 0.0,
        "batches_after_marker": [
            {
                "batch": b["batch"],
                "rows": b["rows"],
                "started_after_marker_s": round((b["start_ms"] - marker_ms) / 1000, 3),
                "took_s": round(float(b["durations_ms"].get("triggerExecution", 0.0)) / 1000, 3),
                "durations_ms": dict(b["durations_ms"]),
            }
            for b in after
        ],
        "seen_s": None if last_end is None else round((drained_ms - last_end) / 1000, 3),
        "total_s": round((drained_ms - marker_ms) / 1000, 3),
    }


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    """numerator / denominator; None when either was not measured or the denominator is zero."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)


def paired_ratios(pairs: Iterable[tuple[float | None, float | None]], digits: int = 3) -> dict[str, Any] | None:
    """The spread of each round's (numerator / denominator): a contender against plain Spark in the
    same round, so a round on a busier machine weighs on both sides of its own ratio only."""
    return spread((ratio(n, d, digits=9) for n, d in pairs), digits)


def tasks_per_batch(batches: Iterable[tuple[int, int]], stages: Iterable[tuple[int, int]]) -> dict[str, Any]:
    """The Spark tasks each micro-batch of one query ran.

    `batches`: (start epoch ms, duration ms) of each of the query's batches in the measured period;
    `stages`: (submission epoch ms, tasks run) of each stage of the query's jobs that Spark's status
    store still holds. A query runs its batches one after the other, so a stage belongs to the batch
    during which it was submitted; a stage submitted outside every batch is counted apart. The store
    forgets the oldest stages beyond `spark.ui.retainedStages`, so a batch that began before the
    first stage still held may have lost some: only the batches that began after it are counted.
    """
    spans = sorted(batches)
    held = sorted(stages)
    if not held:
        return {"batches": len(spans), "counted": 0, "per_batch": [], "unattributed_stages": 0}
    first_held = held[0][0]
    counted = [(start, start + duration) for start, duration in spans if start > first_held]
    tasks = [0] * len(counted)
    unattributed = 0
    for submitted, ran in held:
        at = next((i for i, (start, end) in enumerate(counted) if start <= submitted <= end), None)
        if at is not None:
            tasks[at] += ran
        elif counted and counted[0][0] <= submitted <= counted[-1][1]:
            unattributed += 1  # between two counted batches: not a batch's own work
    out: dict[str, Any] = {
        "batches": len(spans),
        "counted": len(counted),
        "per_batch": tasks,
        "unattributed_stages": unattributed,
    }
    if tasks:
        out |= {
            "median": statistics.median(tasks),
            "mean": round(statistics.fmean(tasks), 1),
            "max": max(tasks),
            "total": sum(tasks),
        }
    return out


def tasks_over_rounds(measured: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """`tasks_per_batch` of each round (or drain) -> the spread over them of each one's median and of
    each one's largest batch, and how many batches were counted in all. A round that counted no
    batch (Spark's store had nothing of it) is left out, as a round that measured nothing is."""
    rounds = [m for m in measured if m.get("counted")]
    return {
        "median": spread(m.get("median") for m in rounds),
        "max": spread(m.get("max") for m in rounds),
        "batches_counted": sum(int(m["counted"]) for m in rounds),
    }


def one_value(values: Iterable[Any]) -> Any:
    """The value every round measured (None if none did); every distinct value, sorted, if they differ."""
    distinct = sorted({v for v in values if v is not None})
    if not distinct:
        return None
    return distinct[0] if len(distinct) == 1 else distinct
