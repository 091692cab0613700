"""The benchmark's arithmetic (no Spark, Kafka or Redis): percentiles, output gaps, coverage of the
source by the results, and the targets' met / not met."""

from __future__ import annotations

from benchmarks.common import Emitted, coverage, percentile, window_gaps
from benchmarks.report import targets


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


def test_targets_report_unmeasured_as_none_and_do_not_pass_them() -> None:
    result = targets({"throughput": {"error": "boom"}, "throughput_ratio": None})
    assert result["throughput_ratio"]["met"] is None
    assert result["p99_swap_over_steady"]["met"] is None
    assert targets({"throughput": {"throughput_ratio": 0.5}})["throughput_ratio"]["met"] is False
