"""Issue 3: live swaps on the real stack, checked against an offline recomputation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from contract.journal import SwapPhase
from contract.models import GraphState
from contract.settings import Settings
from contract.status import SwapStatus
from executor.operator.client import Client
from executor.tools.generator import GeneratorSpec, produce
from service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import QUERIES, REPO, committed_watermark, continuous_load, executor_running, read_topic
from tests.integration.oracle import Version, assert_invariants, count_and_total, mean_and_n, peak_and_low, settle

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
AVERAGE_10S = REPO / "examples" / "average_per_key.py"
TOTAL_20S = QUERIES / "total_per_key_20s.sql"
T0 = 1_700_000_000_000
PHASES = ["submitted", "validated", "deployed", "cut", "draining", "drained", "retired", "completed"]


def swap_and_wait(client: Client, query: Path) -> SwapStatus:
    record = client.submit(query)
    done = client.wait_until_done(record.id, 180)
    assert [p.name for p in done.phases] == PHASES
    return next(s for s in client.status().swaps if s.id == done.id)


def cut_of(swap: SwapStatus) -> int:
    assert swap.cut_window_end is not None, f"swap {swap.id} has no cut"
    return swap.cut_window_end


def test_three_consecutive_swaps_under_load_keep_every_invariant(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    # Event time runs 10x faster than the clock; events are up to 800 ms out of order (lateness 2 s).
    spec = GeneratorSpec(rate=300, keys=4, seed=21, disorder_ms=800, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 20_000, 120, "first windows")
        swaps = [swap_and_wait(client, query) for query in (MAX_30S, AVERAGE_10S, TOTAL_20S)]
        final = swaps[-1].to_query
        last_cut = cut_of(swaps[-1])
        wait_until(lambda: committed_watermark(client, final) >= last_cut + 40_000, 120, "windows after the last cut")
        load.stop()
        truth = settle(settings, lambda: committed_watermark(client, final))
        status = client.status()

    cuts = [truth.cut(client.journal.get(s.id)) for s in swaps]
    assert cuts == sorted(cuts)
    assert cuts[0] % 30_000 == 0  # 10 s -> 30 s
    assert cuts[1] % 30_000 == 0  # 30 s -> 10 s
    assert cuts[2] % 20_000 == 0  # 10 s -> 20 s
    assert status.current is not None
    assert status.current.query_id == final
    assert [g.state for g in status.graphs.values()].count(GraphState.RUNNING) == 1

    versions = [
        Version("count_per_key", 10_000, count_and_total),
        Version("max_per_key_30s", 30_000, peak_and_low),
        Version("average_per_key", 10_000, mean_and_n),
        Version("total_per_key_20s", 20_000, count_and_total),
    ]
    assert [s.to_query for s in swaps] == [v.query_id for v in versions[1:]]
    assert_invariants(read_results(settings), truth.on_time, versions, cuts, truth.closed_until)


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
