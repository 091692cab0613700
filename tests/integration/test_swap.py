"""Issue 3: live swaps on the real stack, checked against an offline recomputation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapPhase
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec, produce
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import committed_watermark, continuous_load, executor_running, read_topic
from tests.integration.oracle import Version, assert_invariants, count_and_total, peak_and_low, settle
from tests.integration.scenarios import (
    COUNT_10S,
    MAX_30S,
    T0,
    assert_three_swaps_keep_every_invariant,
    cut_of,
    swap_and_wait,
    three_swaps_under_load,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_three_consecutive_swaps_under_load_keep_every_invariant(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    with executor_running(settings, spark, COUNT_10S):
        run = three_swaps_under_load(settings, client)
    assert_three_swaps_keep_every_invariant(settings, client, run)


def slow_query(tmp_path: Path, sleep_s: float) -> Path:
    """A Python query whose first batch of real events stalls, as a query with a slow start would."""
    done = tmp_path / "slow-start-done"
    path = tmp_path / "slow_start.py"
    path.write_text(
        f"""
import os
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

DONE = {str(done)!r}


def _stall_once(ts):
    # Only this test's events (from 2027 on) stall.
    if ts > 1_790_000_000_000 and not os.path.exists(DONE):
        time.sleep({sleep_s})
        open(DONE, "w").close()
    return ts


def query(events: DataFrame) -> DataFrame:
    stall = F.udf(_stall_once, "long")
    return (
        events.where(stall("ts") >= 0)
        .groupBy(F.window("event_time", "10 seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "key", "n",
                "total")
    )
"""
    )
    return path


def test_a_new_query_slow_to_start_buffers_its_rows_in_its_topic(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    start = 1_800_000_000_000
    spec = GeneratorSpec(rate=300, keys=3, seed=8, disorder_ms=300, time_scale=10, start_ts=start)
    query = slow_query(tmp_path, sleep_s=20)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > start + 10_000, 120, "first windows")
        record = client.submit(query)
        client.wait_for(record.id, lambda r: r.state.is_past_cut, 120, "cut")
        topic = settings.names.graph_topic("slow_start")
        # While the new query stalls, its rows wait in its topic and it has answered nothing.
        buffered = wait_until(lambda: len(read_topic(settings, topic)) >= 500, 60, "rows buffered in the new topic")
        assert buffered
        assert not [r for r in read_results(settings) if r.query_id == "slow_start"]
        done = client.wait_until_done(record.id, 180)
        wait_until(
            lambda: committed_watermark(client, "slow_start") >= int(done.cut_window_end or 0) + 30_000,
            120,
            "the slow query to catch up",
        )
        load.stop()
        truth = settle(settings, lambda: committed_watermark(client, "slow_start"))

    assert (tmp_path / "slow-start-done").exists()
    versions = [Version("count_per_key", 10_000, count_and_total), Version("slow_start", 10_000, count_and_total)]
    assert_invariants(read_results(settings), truth.on_time, versions, [truth.cut(done)], truth.closed_until)


def test_a_swap_from_10s_to_30s_windows_cuts_on_a_30s_boundary(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    spec = GeneratorSpec(rate=300, keys=3, seed=4, disorder_ms=500, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        before = max(p.window_end or 0 for p in client.status().service.partitions.values())
        swap = swap_and_wait(client, MAX_30S)
        cut = cut_of(swap)
        wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 60_000, 120, "30 s windows")
        load.stop()
        truth = settle(settings, lambda: committed_watermark(client, "max_per_key_30s"))

    assert truth.cut(client.journal.get(swap.id)) == cut
    assert cut % 30_000 == 0
    assert cut >= before
    results = read_results(settings)
    old = {r.window_end - r.window_start for r in results if r.query_id == "count_per_key"}
    new = {r.window_end - r.window_start for r in results if r.query_id == "max_per_key_30s"}
    assert (old, new) == ({10_000}, {30_000})
    assert min(r.window_start for r in results if r.query_id == "max_per_key_30s") == cut
    assert max(r.window_end for r in results if r.query_id == "count_per_key") == cut
    versions = [Version("count_per_key", 10_000, count_and_total), Version("max_per_key_30s", 30_000, peak_and_low)]
    assert_invariants(results, truth.on_time, versions, [cut], truth.closed_until)


def test_late_events_after_a_cut_go_to_the_late_topic_and_are_counted(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    spec = GeneratorSpec(rate=300, keys=3, seed=5, disorder_ms=200, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec):
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        swap = swap_and_wait(client, MAX_30S)
        cut = cut_of(swap)
        results_before = {r.key: r.row for r in read_results(settings)}
        # Twenty events for windows the old query already answered, long after the cut.
        late_spec = GeneratorSpec(rate=1000, keys=2, seed=99, count=20, start_ts=cut - 25_000)
        produce(settings, late_spec, settings.source_topic)
        wait_until(lambda: client.status().late_records >= 20, 60, "late records to be counted")
        assert client.status().late_records == 20
    late = read_topic(settings, settings.names.late_topic)
    assert len(late) == 20
    assert all(int(json.loads(r.value)["ts"]) < cut for r in late)
    # The old version's answers are untouched: nothing re-opened a window at or before W.
    after = {r.key: r.row for r in read_results(settings) if r.window_end <= cut}
    assert after == {k: v for k, v in results_before.items() if v["window_end"] <= cut}
    assert swap.state is SwapPhase.COMPLETED
