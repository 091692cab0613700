"""The benchmark's arithmetic (no Spark, Kafka or Redis): percentiles, output gaps, coverage of the
source by the results, median and spread over rounds, throughput as a slope, CPU per 1,000 events,
a swap's phases against its floor, and the targets' met / not met."""

from __future__ import annotations

import pytest

from benchmarks.common import Emitted, coverage, percentile, window_gaps
from benchmarks.measures import (
    batch_points,
    change_between,
    drain_batches,
    emission_points,
    fit_slope,
    per_thousand,
    spread,
    steady_slope,
    swap_phases,
)
from benchmarks.report import fmt, targets


def emitted(window_start: int, emit_ms: int, n: int = 5) -> Emitted:
    return Emitted(emit_ms, window_start, window_start + 10_000, "q", n)


def test_percentile_is_nearest_rank() -> None:
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile(list(range(1, 101)), 50) == 50
    assert percentile([], 99) is None


def test_window_gaps_take_each_window_first_result() -> None:
    results = [emitted(0, 12_000), emitted(0, 12_500), emitted(10_000, 22_000), emitted(20_000, 37_000)]
    assert window_gaps(results, 0, 10**9) == 15.0
    assert window_gaps(results, 0, 21_000) == 10.0


def test_coverage_counts_missing_incomplete_and_lost_events() -> None:
    results = [emitted(0, 1), emitted(20_000, 2, n=3), emitted(30_000, 3)]
    got = coverage(results, {0: 5, 10_000: 7, 20_000: 5, 30_000: 5})
    assert got == {"windows": 4, "missing_windows": 1, "incomplete_windows": 1, "events_lost": 9, "events_extra": 0}


# -- median and spread over rounds ----------------------------------------------------------------


def test_spread_is_median_min_and_max_of_the_rounds_that_measured() -> None:
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([4.0, 1.0, None, 2.0, 3.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "n": 4}
    assert spread([None, None]) is None
    assert spread([]) is None


def test_spread_rounds_to_the_digits_asked() -> None:
    assert spread([1234.4, 1000.2, 999.9], digits=0) == {"median": 1000.0, "min": 1000.0, "max": 1234.0, "n": 3}


def test_a_spread_prints_as_median_and_range() -> None:
    assert fmt({"median": 0.5, "min": 0.25, "max": 0.75, "n": 3}) == "0.500 [0.250-0.750]"
    assert fmt({"median": 12000.0, "min": 9000.0, "max": 15500.0, "n": 3}, 0) == "12,000 [9,000-15,500]"
    assert fmt(None) == "n/a"


# -- throughput as a slope ------------------------------------------------------------------------


def test_fit_slope_of_a_line_is_its_slope() -> None:
    assert fit_slope([(x, 3 * x + 2) for x in range(10)]) == pytest.approx(3.0)
    assert fit_slope([(1.0, 5.0)]) is None
    assert fit_slope([(1.0, 5.0), (1.0, 7.0)]) is None


def test_steady_slope_ignores_the_start_up_and_the_tail() -> None:
    # 100,000 rows: a slow start (5,000 rows in the first 4 s), then 10,000 rows/s in batches of
    # 10,000 every second, then a tail that crawls (the last windows waiting for the watermark).
    points = [(0, 0), (4_000, 5_000)]
    points += [(4_000 + i * 1_000, 5_000 + i * 10_000) for i in range(1, 10)]  # up to 95,000 at 13 s
    points += [(25_000, 100_000)]
    got = steady_slope(points)
    assert got["events_per_s"] == 10_000
    assert got["points"] == 8  # 15,000 to 85,000 rows
    assert got["rows"] == 100_000
    # End-to-end time would say 4,000 rows/s: the start-up and the tail are what the slope leaves out.
    assert 100_000 / 25 == 4_000


def test_steady_slope_falls_back_to_every_point_when_the_middle_has_too_few() -> None:
    got = steady_slope([(0, 0), (1_000, 50_000), (2_000, 100_000)])
    assert got["fit"].startswith("every point")
    assert got["events_per_s"] == 50_000
    assert steady_slope([])["events_per_s"] is None


def test_results_of_one_batch_make_one_point() -> None:
    # Two batches: three results written within 20 ms, then two results a second later.
    results = [(1_000, 10), (1_010, 20), (1_020, 30), (2_000, 5), (2_005, 5)]
    assert emission_points(results) == [(1_020, 60), (2_005, 70)]


def test_batch_points_end_at_each_batch_end() -> None:
    assert batch_points([(2_000, 500, 30), (1_000, 800, 20)]) == [(1_800, 20), (2_500, 50)]


# -- CPU per 1,000 events -------------------------------------------------------------------------


def test_change_between_interpolates_cumulative_samples() -> None:
    samples = [(0, 10.0), (1_000, 11.0), (2_000, 13.0), (3_000, 13.5)]
    assert change_between(samples, 500, 2_500) == pytest.approx(13.25 - 10.5)
    assert change_between(samples, 0, 3_000) == pytest.approx(3.5)
    assert change_between(samples, -1, 1_000) is None  # before the first sample
    assert change_between(samples, 0, 4_000) is None  # after the last


def test_cpu_per_thousand_events() -> None:
    assert per_thousand(3.0, 6_000) == 0.5
    assert per_thousand(None, 6_000) is None
    assert per_thousand(1.0, 0) is None


# -- a swap against its floor ---------------------------------------------------------------------


def test_swap_phases_against_the_floor_read_whatever_phases_were_recorded() -> None:
    # `deploying` and `retiring` are not phases of this version's journal: they must come through.
    recorded = [
        ("submitted", 100_000),
        ("validated", 101_000),
        ("deploying", 101_500),
        ("deployed", 103_000),
        ("cut", 103_500),
        ("draining", 113_000),
        ("drained", 114_000),
        ("retiring", 114_200),
        ("retired", 114_500),
        ("completed", 115_000),
    ]
    got = swap_phases(recorded, cut_window_end=110_000, lateness_ms=2_000)
    assert got["total_s"] == 15.0
    assert got["floor_s"] == 12.0  # W + lateness - submitted
    assert got["overhead_over_floor_s"] == 3.0
    assert [p["phase"] for p in got["phases"]] == [name for name, _ in recorded]
    by_name = {p["phase"]: p for p in got["phases"]}
    assert by_name["deploying"]["duration_s"] == 1.5
    assert by_name["draining"]["duration_s"] == 1.0
    assert by_name["draining"]["after_floor_s"] == 1.0  # the drain began 1 s after the floor
    assert by_name["completed"]["duration_s"] is None
    assert by_name["submitted"]["at_s"] == 0.0


def test_swap_phases_of_a_swap_that_did_not_complete() -> None:
    got = swap_phases([("submitted", 0), ("validated", 500), ("failed", 900)], cut_window_end=None, lateness_ms=2_000)
    assert got["total_s"] is None
    assert got["floor_s"] is None
    assert got["overhead_over_floor_s"] is None
    assert got["phases"][1]["duration_s"] == 0.4


# -- targets --------------------------------------------------------------------------------------


def test_targets_report_unmeasured_as_none_and_do_not_pass_them() -> None:
    result = targets({"throughput": {"error": "boom"}, "throughput_ratio": None})
    assert result["throughput_ratio"]["met"] is None
    assert result["steady_p99_s"]["met"] is None
    assert result["p99_swap_over_steady"]["met"] is None


def test_targets_judge_the_median_of_the_rounds() -> None:
    results = {
        "throughput": {"throughput_ratio": {"median": 0.72, "min": 0.6, "max": 0.9, "n": 3}},
        "latency": {"hotswap": {"p99_s": {"median": 2.5, "min": 1.5, "max": 3.0, "n": 3}}},
        "live": {"swap": {"overhead_over_floor_s": 2.9}},
    }
    got = targets(results)
    assert got["throughput_ratio"]["value"] == 0.72
    assert got["throughput_ratio"]["met"] is True  # >= 0.7; the goal of 0.8 is stated beside it
    assert got["steady_p99_s"]["met"] is False
    assert got["swap_overhead_over_floor_s"]["met"] is True


def test_control_state_target_is_judged_on_the_ratio_of_200_swaps_to_one() -> None:
    assert targets({})["control_state_cost_flat"]["met"] is None  # not measured: neither met nor missed
    measured = {"ratio": 1.04, "flat": True, "median_ms": {"1": {"service_batch_ms": 2.3}, "200": {"x": 2.4}}}
    got = targets({"control_state": measured})["control_state_cost_flat"]
    assert (got["value"], got["met"]) == (1.04, True)
    assert (
        targets({"control_state": {**measured, "ratio": 1.3, "flat": False}})["control_state_cost_flat"]["met"] is False
    )


def test_a_drain_splits_into_the_batch_in_flight_the_batches_after_the_marker_and_the_wait_to_see_them() -> None:
    def batch(n: int, start: int, took: int, rows: int = 0) -> dict[str, object]:
        return {"batch": n, "start_ms": start, "rows": rows, "durations_ms": {"triggerExecution": took}}

    old_graph = [
        batch(7, 8_000, 1_000, rows=40),  # ended before the marker
        batch(8, 9_500, 1_000, rows=30),  # in flight when the marker was written at 10,000
        batch(9, 10_500, 1_200, rows=5),  # read the marker
        batch(10, 11_700, 800),  # closed the windows through W
    ]
    got = drain_batches(old_graph, marker_ms=10_000, drained_ms=12_750)
    assert got["in_flight_s"] == 0.5
    assert [(b["batch"], b["started_after_marker_s"], b["took_s"]) for b in got["batches_after_marker"]] == [
        (9, 0.5, 1.2),
        (10, 1.7, 0.8),
    ]
    assert got["seen_s"] == 0.25
    assert got["total_s"] == 2.75
