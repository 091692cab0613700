"""Rewrites: where a replayed service batch may have written rows twice, and which windows a closing
graph therefore deduplicates (contract/rewrites.py, execution_graph/task_slots.py)."""

from __future__ import annotations

import fakeredis
import pytest

from hotswap.contract.fence import fenced_write
from hotswap.contract.names import Keys
from hotswap.contract.rewrites import (
    EARLIER_BUILD,
    REWRITES_KEPT,
    Rewrite,
    queue_no_rewrite,
    queue_recording_begins,
    queue_rewrite,
    read_rewrites,
)
from hotswap.execution_graph.task_slots import runs_tasks_twice

KEYS = Keys("unit")


@pytest.mark.parametrize(
    ("rewrite", "since", "until", "reaches"),
    [
        (Rewrite(since_ms=10_000, until_ms=19_999), 0, 10_000, False),  # windows before it
        (Rewrite(since_ms=10_000, until_ms=19_999), 0, 10_001, True),
        (Rewrite(since_ms=10_000, until_ms=19_999), 19_999, 30_000, True),
        (Rewrite(since_ms=10_000, until_ms=19_999), 20_000, 30_000, False),  # windows after it
        (Rewrite(since_ms=10_000), 90_000, 100_000, True),  # a replay not written yet: every later window
        (Rewrite(since_ms=None, until_ms=5_000), None, 1_000, True),  # a first batch: no lower bound
        (Rewrite(since_ms=None, until_ms=5_000), 6_000, 9_000, False),
    ],
)
def test_a_rewrite_reaches_the_windows_whose_rows_it_may_hold(
    rewrite: Rewrite, since: int | None, until: int, reaches: bool
) -> None:
    assert rewrite.reaches(since, until) is reaches


def test_rewrites_are_recorded_closed_and_removed_by_batch() -> None:
    client = fakeredis.FakeRedis()
    fenced_write(client, None, lambda pipe: queue_rewrite(pipe, KEYS, 7, Rewrite(since_ms=1_000), {}))
    assert read_rewrites(client, KEYS) == {7: Rewrite(since_ms=1_000)}
    held = read_rewrites(client, KEYS)
    fenced_write(client, None, lambda pipe: queue_rewrite(pipe, KEYS, 7, Rewrite(since_ms=1_000, until_ms=4_000), held))
    assert read_rewrites(client, KEYS) == {7: Rewrite(since_ms=1_000, until_ms=4_000)}
    fenced_write(client, None, lambda pipe: queue_no_rewrite(pipe, KEYS, 7))
    assert read_rewrites(client, KEYS) == {}


def record(client: fakeredis.FakeRedis, batch: int, rewrite: Rewrite) -> None:
    held = read_rewrites(client, KEYS)
    fenced_write(client, None, lambda pipe: queue_rewrite(pipe, KEYS, batch, rewrite, held))


def test_past_the_kept_number_the_oldest_rewrites_merge_and_still_reach_their_windows() -> None:
    client = fakeredis.FakeRedis()
    for batch in range(REWRITES_KEPT + 5):
        record(client, batch, Rewrite(since_ms=batch * 10_000, until_ms=batch * 10_000 + 999))
    kept = read_rewrites(client, KEYS)
    assert len(kept) == REWRITES_KEPT
    # Every batch's event times are still reached by some record.
    for batch in range(REWRITES_KEPT + 5):
        assert any(r.reaches(batch * 10_000, batch * 10_000 + 1) for r in kept.values()), batch
    assert max(kept) == REWRITES_KEPT + 4


NO_UI = {"spark.ui.enabled": "false"}


@pytest.mark.parametrize(
    ("master", "conf", "twice"),
    [
        ("local[2]", NO_UI, False),
        ("local", NO_UI, False),
        ("local[*]", {**NO_UI, "spark.speculation": "false"}, False),
        ("local[2]", {**NO_UI, "spark.speculation": "true"}, True),  # speculative copies
        ("local[2,3]", NO_UI, True),  # local with retries
        ("local[2]", {}, True),  # the UI's kill link: a killed task is queued again
        ("local[2]", {"spark.ui.killEnabled": "false"}, False),
        ("spark://host:7077", NO_UI, True),
        ("yarn", NO_UI, True),
    ],
)
def test_only_one_attempt_local_masters_never_run_a_task_twice(master: str, conf: dict[str, str], twice: bool) -> None:
    assert runs_tasks_twice(master, conf) is twice


def test_rows_an_earlier_build_routed_get_one_rewrite_when_recording_begins() -> None:
    client = fakeredis.FakeRedis()
    fenced_write(client, None, lambda pipe: queue_recording_begins(pipe, KEYS, 50_000, {}))
    assert read_rewrites(client, KEYS) == {EARLIER_BUILD: Rewrite(since_ms=None, until_ms=50_000)}
    assert client.exists(KEYS.rewrites_recorded)
    fresh = fakeredis.FakeRedis()
    fenced_write(fresh, None, lambda pipe: queue_recording_begins(pipe, KEYS, None, {}))
    assert read_rewrites(fresh, KEYS) == {}
    assert fresh.exists(KEYS.rewrites_recorded)
