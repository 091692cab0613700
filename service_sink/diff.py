"""Comparing a shadow's output with the current version's, window by window.

A shadow (README, "Shadow runs") receives every row from a boundary S on, beside the current query,
and writes its results to its own topic. `compare` matches the two versions' results for every
window both have closed since S: by window (start and end) and by the group columns both versions
have (by name), and compares the value columns they share by name. Floating-point values match
within a tolerance (relative, with the same absolute floor near zero). Pure: the caller reads the
results (service_sink.audit.read_results) and knows how far both versions have closed windows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from hotswap.contract.models import DiffExample, ShadowDiff, now_ms
from hotswap.service_sink.audit import Result

EXAMPLES = 5  # how many differing values a summary quotes
NOT_VALUES = ("window_start", "window_end", "query_id")

GroupKey = tuple[int, int, tuple[Any, ...]]  # window start, window end, shared group values


def compare(
    current: Iterable[Result],
    shadow: Iterable[Result],
    *,
    current_groups: Sequence[str],
    shadow_groups: Sequence[str],
    since: int,
    closed_through: int,
    tolerance: float = 1e-9,
    shadow_id: str = "",
) -> ShadowDiff:
    """The two versions' results for windows that start at or after `since` and end at or before
    `closed_through`, compared."""
    shared_groups = tuple(g for g in current_groups if g in shadow_groups)
    mine = _by_key(current, shared_groups, since, closed_through)
    theirs = _by_key(shadow, shared_groups, since, closed_through)
    windows = {key[:2] for key in mine} & {key[:2] for key in theirs}
    mine = {k: v for k, v in mine.items() if k[:2] in windows}
    theirs = {k: v for k, v in theirs.items() if k[:2] in windows}
    differ = 0
    compared = 0
    columns: set[str] = set()
    examples: list[DiffExample] = []
    ambiguous = 0
    for key in sorted(set(mine) & set(theirs), key=repr):
        a, b = mine[key], theirs[key]
        if len(a) != 1 or len(b) != 1:
            ambiguous += 1  # several rows per shared group: the group columns differ in more than names
            continue
        compared += 1
        shared = (set(a[0].row) & set(b[0].row)) - set(NOT_VALUES) - set(current_groups) - set(shadow_groups)
        columns |= shared
        for column in sorted(shared):
            left, right = a[0].row[column], b[0].row[column]
            if not _same(left, right, tolerance):
                differ += 1
                if len(examples) < EXAMPLES:
                    examples.append(
                        DiffExample(
                            window_start=key[0],
                            window_end=key[1],
                            group=dict(zip(shared_groups, key[2], strict=True)),
                            column=column,
                            current=left,
                            shadow=right,
                        )
                    )
    return ShadowDiff(
        shadow_id=shadow_id,
        since=since,
        closed_through=closed_through,
        windows_compared=len(windows),
        groups_compared=compared,
        only_current=len(set(mine) - set(theirs)),
        only_shadow=len(set(theirs) - set(mine)),
        ambiguous_groups=ambiguous,
        values_differ=differ,
        columns_compared=tuple(sorted(columns)),
        group_columns=shared_groups,
        group_columns_differ=tuple(current_groups) != tuple(shadow_groups),
        tolerance=tolerance,
        examples=tuple(examples),
        computed_at=now_ms(),
    )


def _by_key(results: Iterable[Result], groups: Sequence[str], since: int, through: int) -> dict[GroupKey, list[Result]]:
    out: dict[GroupKey, list[Result]] = defaultdict(list)
    seen: set[str] = set()
    for result in results:
        if result.window_start < since or result.window_end > through:
            continue
        if result.key in seen:
            continue  # a replayed batch wrote the same result again under the same key
        seen.add(result.key)
        out[(result.window_start, result.window_end, tuple(result.row.get(g) for g in groups))].append(result)
    return out


def _same(left: Any, right: Any, tolerance: float) -> bool:
    numbers = (int, float)
    if isinstance(left, numbers) and isinstance(right, numbers) and not isinstance(left, bool):
        if isinstance(left, float) or isinstance(right, float):
            return math.isclose(float(left), float(right), rel_tol=tolerance, abs_tol=tolerance)
        return left == right
    return bool(left == right)
