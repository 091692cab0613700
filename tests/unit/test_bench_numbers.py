"""The benchmark's arithmetic (no Spark, Kafka or Redis): percentiles, output gaps, coverage of the
source by the results, median and spread over rounds, throughput as a slope, CPU per 1,000 events,
a swap's phases against its floor, ratios round by round, the Spark tasks each batch ran, and the
targets' and each engine's goals' met / not met."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.common import Emitted, coverage, percentile, window_gaps
from benchmarks.measures import (
    batch_points,
    change_between,
    drain_batches,
    emission_points,
    fit_slope,
    one_value,
    paired_ratios,
    per_thousand,
    ratio,
    spread,
    steady_slope,
    swap_phases,
    tasks_over_rounds,
    tasks_per_batch,
)
from benchmarks.report import engine_goals, engine_summary, fmt, goals_table, table, targets


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


# -- one contender against another ---------------------------------------------------------------


def test_ratio_is_none_when_either_side_is_unmeasured_or_the_base_is_zero() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 3.0) == 0.333
    assert ratio(None, 2.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


def test_paired_ratios_take_each_round_against_its_own_base_then_the_spread() -> None:
    # Round 2 ran on a busier machine: both sides slower, its ratio no worse for it.
    rounds = [(20_000.0, 40_000.0), (10_000.0, 20_000.0), (18_000.0, 30_000.0), (15_000.0, None)]
    assert paired_ratios(rounds) == {"median": 0.5, "min": 0.5, "max": 0.6, "n": 3}
    assert paired_ratios([(None, 1.0)]) is None


# -- Spark tasks per batch ------------------------------------------------------------------------


def test_each_stage_counts_for_the_batch_during_which_it_was_submitted() -> None:
    batches = [(1_000, 500), (2_000, 800), (3_000, 400)]  # (start ms, duration ms)
    stages = [
        (900, 1),  # the first stage still held: batches from here on are counted
        (1_100, 2),  # batch at 1,000: a header aggregation over 2 partitions
        (1_200, 2),  # ... and its shuffle
        (2_050, 2),
        (2_300, 4),  # batch at 2,000 also closed a window: the batch read and its shuffle
        (2_600, 2),
        (1_700, 3),  # between two batches: no batch's own work
        (3_000, 2),  # a stage submitted as its batch starts is its batch's
    ]
    got = tasks_per_batch(batches, stages)
    assert got["per_batch"] == [4, 8, 2]
    assert (got["batches"], got["counted"], got["unattributed_stages"]) == (3, 3, 1)
    assert (got["median"], got["max"], got["total"], got["mean"]) == (4, 8, 14, 4.7)


def test_batches_before_the_first_stage_spark_still_holds_are_not_counted() -> None:
    # Spark forgot the stages before 2,100: the batch at 1,000 and the one at 2,000 (which may have
    # lost its first stages) are left out rather than counted short.
    batches = [(1_000, 500), (2_000, 800), (3_000, 400)]
    got = tasks_per_batch(batches, [(2_100, 2), (2_200, 2), (3_100, 3)])
    assert got["per_batch"] == [3]
    assert (got["batches"], got["counted"]) == (3, 1)


def test_no_stage_held_counts_no_batch() -> None:
    got = tasks_per_batch([(1_000, 500)], [])
    assert (got["batches"], got["counted"], got["per_batch"]) == (1, 0, [])
    assert "median" not in got


def test_tasks_over_rounds_spread_the_rounds_medians_and_largest_batches() -> None:
    rounds: list[dict[str, Any]] = [
        {"counted": 40, "median": 3, "max": 9},
        {"counted": 38, "median": 5, "max": 11},
        {"counted": 0, "per_batch": []},  # Spark's store had nothing of this round
        {"counted": 41, "median": 4, "max": 10},
    ]
    got = tasks_over_rounds(rounds)
    assert got["median"] == {"median": 4.0, "min": 3.0, "max": 5.0, "n": 3}
    assert got["max"] == {"median": 10.0, "min": 9.0, "max": 11.0, "n": 3}
    assert got["batches_counted"] == 119
    assert tasks_over_rounds([]) == {"median": None, "max": None, "batches_counted": 0}


def test_one_value_is_the_value_every_round_measured_else_all_of_them() -> None:
    assert one_value([2, 2, None, 2]) == 2
    assert one_value([1, 2, 1]) == [1, 2]
    assert one_value([None]) is None


# -- each engine against the goals -------------------------------------------------------


def _two_engines() -> dict[str, object]:
    def over_rounds(median: float) -> dict[str, float]:
        return {"median": median, "min": median, "max": median, "n": 3}

    def live(during: float, steady: float, over_floor: float) -> dict[str, object]:
        return {
            "latency": {
                "steady": {"p50_s": steady, "p99_s": steady},
                "during_swap": {"p50_s": during, "p99_s": during},
            },
            "swap": {"overhead_over_floor_s": over_floor},
        }

    def graphs(partitions: int, median: float, largest: int) -> dict[str, object]:
        return {
            "graph.count_per_key": {
                "engine": "closing" if partitions > 1 else "stateful",
                "topic_partitions": partitions,
                "tasks": {"counted": 30, "median": median, "max": largest},
            }
        }

    rounds = [
        {
            "round": n,
            "plain_spark": {"steady": {"p99_s": 1.2}},
            "hotswap": {"steady": {"p99_s": 3.5}, "profile": {"graphs": graphs(1, 5, 7)}},
            "hotswap_closing": {"steady": {"p99_s": 1.6}, "profile": {"graphs": graphs(2, 3 + n, 12)}},
        }
        for n in (1, 2, 3)
    ]
    return {
        "throughput": {
            "throughput_ratio": over_rounds(0.53),
            "throughput_ratios": {"hotswap": over_rounds(0.53), "hotswap_closing": over_rounds(0.85)},
            "runs": [
                {"side": "hotswap_closing", "graphs": graphs(2, 6, 20)},
                {"side": "hotswap", "graphs": graphs(1, 5, 9)},
                {"side": "hotswap_closing", "error": "TimeoutError: ..."},
            ],
        },
        "latency": {
            "plain_spark": {"p99_s": over_rounds(1.2)},
            "hotswap": {"p99_s": over_rounds(3.5)},
            "hotswap_closing": {"p99_s": over_rounds(1.6)},
            "p99_over_plain": {"hotswap": over_rounds(2.9), "hotswap_closing": over_rounds(1.33)},
            "rounds": rounds,
        },
        "live": live(during=5.2, steady=3.5, over_floor=5.8),
        "live_closing": live(during=1.8, steady=1.6, over_floor=1.5),
    }


def test_each_engine_is_judged_against_the_goals_on_its_own_numbers() -> None:
    results = _two_engines()
    stateful, closing = engine_goals(results, "hotswap"), engine_goals(results, "hotswap_closing")
    assert {k: g["met"] for k, g in stateful.items()} == {
        "throughput_ratio": False,
        "steady_p99_over_plain": False,
        "steady_p99_s": False,
        "p99_swap_over_steady": False,
        "swap_over_floor_s": False,
    }
    assert {k: g["met"] for k, g in closing.items()} == {
        "throughput_ratio": True,  # 0.85 >= 0.8
        "steady_p99_over_plain": True,  # 1.33 <= 1.5
        "steady_p99_s": True,  # 1.6 <= 2.0
        "p99_swap_over_steady": True,  # 1.8 / 1.6 = 1.125 <= 1.25
        "swap_over_floor_s": True,  # 1.5 <= 2
    }
    assert closing["p99_swap_over_steady"]["value"] == 1.125
    assert closing["throughput_ratio"]["spread"]["n"] == 3


def test_an_engine_the_run_did_not_measure_meets_no_goal() -> None:
    goals = engine_goals({"throughput": {"error": "boom"}}, "hotswap_closing")
    assert all(goal["met"] is None for goal in goals.values())
    # A run from before the engines were told apart: the stateful engine's ratio under its old name.
    old = engine_goals(
        {"throughput": {"throughput_ratio": {"median": 0.82, "min": 0.8, "max": 0.9, "n": 3}}}, "hotswap"
    )
    assert old["throughput_ratio"]["met"] is True


def test_engine_summary_gathers_partitions_and_tasks_per_batch_over_rounds_and_drains() -> None:
    results = _two_engines()
    closing = engine_summary(results, "hotswap_closing")
    assert (closing["graph_engine"], closing["graph_topic_partitions"]) == ("closing", 2)
    steady, drain = closing["graph_tasks_per_batch"]["steady"], closing["graph_tasks_per_batch"]["drain"]
    assert steady["median"] == {"median": 5.0, "min": 4.0, "max": 6.0, "n": 3}
    assert steady["batches_counted"] == 90
    assert drain["max"] == {"median": 20.0, "min": 20.0, "max": 20.0, "n": 1}  # the failed drain counts nothing
    assert engine_summary(results, "hotswap")["graph_topic_partitions"] == 1


def test_the_tables_show_every_contender_and_each_engine_against_the_goals() -> None:
    results = _two_engines()
    results["engines"] = {side: engine_summary(results, side) for side in ("hotswap", "hotswap_closing")}
    headline = table(results).splitlines()
    assert headline[0] == "| measure | plain Spark | hotswap (stateful) | hotswap (closing) |"
    assert all(line.count("|") == 5 for line in headline)
    partitions = next(line for line in headline if line.startswith("| execution graph topic partitions"))
    assert partitions == "| execution graph topic partitions |  | 1 | 2 |"
    tasks = next(line for line in headline if line.startswith("| Spark tasks per execution-graph batch"))
    assert "steady 5.0 [5.0-5.0] (7 [7-7]); drain 5.0 [5.0-5.0] (9 [9-9])" in tasks
    goals = goals_table(results).splitlines()
    assert goals[0] == "| goal | hotswap (stateful) | hotswap (closing) |"
    swap = next(line for line in goals if line.startswith("| swap over its floor"))
    assert swap == "| swap over its floor, s (goal <= 2) | 5.800 (not met) | 1.500 (met) |"
    assert "not measured" in goals_table({}).splitlines()[2]
