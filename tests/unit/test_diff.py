"""A shadow's output against the current version's: what `hotswap diff` reports."""

from __future__ import annotations

import json

from hotswap.service_sink.audit import Result
from hotswap.service_sink.diff import compare

S = 1_700_000_040_000


def result(query: str, start: int, key: str, **values: float) -> Result:
    row = {"window_start": start, "window_end": start + 10_000, "key": key, **values, "query_id": query}
    return Result(json.dumps({"window_start": start, "key": key}), query, start, start + 10_000, row)


def test_identical_logic_gives_no_difference() -> None:
    current = [result("a", S + i * 10_000, k, n=i, total=1.5 * i) for i in range(3) for k in ("k1", "k2")]
    shadow = [result("b", r.window_start, r.row["key"], n=r.row["n"], total=r.row["total"]) for r in current]
    diff = compare(current, shadow, current_groups=["key"], shadow_groups=["key"], since=S, closed_through=S + 30_000)
    assert (diff.windows_compared, diff.groups_compared, diff.values_differ) == (3, 6, 0)
    assert diff.identical
    assert diff.columns_compared == ("n", "total")


def test_a_changed_aggregate_shows_exactly_the_cells_that_differ() -> None:
    current = [result("a", S, "k1", n=3, total=6.0), result("a", S, "k2", n=1, total=2.0)]
    shadow = [result("b", S, "k1", n=3, total=6.5), result("b", S, "k2", n=1, total=2.0)]
    diff = compare(current, shadow, current_groups=["key"], shadow_groups=["key"], since=S, closed_through=S + 10_000)
    assert diff.values_differ == 1
    (example,) = diff.examples
    assert (example.group, example.column, example.current, example.shadow) == ({"key": "k1"}, "total", 6.0, 6.5)


def test_floats_within_the_tolerance_match() -> None:
    current = [result("a", S, "k1", mean=1.0)]
    shadow = [result("b", S, "k1", mean=1.0 + 1e-12)]
    strict = compare(
        current, shadow, current_groups=["key"], shadow_groups=["key"], since=S, closed_through=S + 10_000, tolerance=0
    )
    loose = compare(current, shadow, current_groups=["key"], shadow_groups=["key"], since=S, closed_through=S + 10_000)
    assert (strict.values_differ, loose.values_differ) == (1, 0)


def test_groups_in_one_version_only_and_windows_outside_the_range_are_reported_or_left_out() -> None:
    current = [result("a", S, "k1", n=1), result("a", S, "k2", n=1), result("a", S - 10_000, "k1", n=9)]
    shadow = [result("b", S, "k1", n=1), result("b", S, "k3", n=1), result("b", S + 10_000, "k1", n=1)]
    diff = compare(current, shadow, current_groups=["key"], shadow_groups=["key"], since=S, closed_through=S + 10_000)
    assert (diff.windows_compared, diff.only_current, diff.only_shadow) == (1, 1, 1)


def test_a_replayed_result_counts_once() -> None:
    current = [result("a", S, "k1", n=1), result("a", S, "k1", n=1)]
    shadow = [result("b", S, "k1", n=1)]
    diff = compare(current, shadow, current_groups=["key"], shadow_groups=["key"], since=S, closed_through=S + 10_000)
    assert (diff.groups_compared, diff.ambiguous_groups) == (1, 0)
