"""Issue 3: live swaps on the real stack, checked against an offline recomputation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.records import read_progress, read_service_state
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec, produce
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import (
    changed,
    committed_watermark,
    continuous_load,
    executor_running,
    final_graph,
    read_topic,
    slow_to_start,
    stalls_once,
    tally,
)
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


def phase_at(record: SwapRecord, phase: SwapPhase) -> float:
    """When the swap entered `phase`, in seconds since the epoch."""
    return next(p.at for p in record.phases if p.name is phase) / 1000


@pytest.mark.parametrize("engine", ["closing", "stateful"])
def test_three_consecutive_swaps_under_load_keep_every_invariant(
    settings: Settings, spark: SparkSession, client: Client, engine: str
) -> None:
    on_engine = changed(settings, graph_engine=engine)
    with executor_running(on_engine, spark, COUNT_10S):
        run = three_swaps_under_load(on_engine, client)
    assert_three_swaps_keep_every_invariant(on_engine, client, run)


def test_a_new_query_slow_to_start_buffers_its_rows_while_the_old_graph_drains(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    start = 1_800_000_000_000
    spec = GeneratorSpec(rate=300, keys=3, seed=8, disorder_ms=300, time_scale=10, start_ts=start)
    query = stalls_once(tmp_path, sleep_s=30)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > start + 10_000, 120, "first windows")
        record = client.submit(query)
        wait_until(lambda: tally(tmp_path, "slow_start", "stalling") >= 1, 120, "the new query to stall")
        topic = settings.names.graph_topic("slow_start")
        stalled_with = len(read_topic(settings, topic))
        # While the new query's tasks stall, the service graph routes on (its rows wait in its topic) and
        # the old graph drains: the swap completes, and the new query has answered nothing yet.
        wait_until(lambda: len(read_topic(settings, topic)) >= stalled_with + 500, 60, "rows buffered in the new topic")
        done = client.wait_until_done(record.id, 60)
        assert tally(tmp_path, "slow_start", "stalled") == 0, "the stall ended before the test could look"
        assert not [r for r in read_results(settings.kafka, settings.sink_topic) if r.query_id == "slow_start"]
        wait_until(
            lambda: committed_watermark(client, "slow_start") >= int(done.cut_window_end or 0) + 30_000,
            120,
            "the slow query to catch up",
        )
        load.stop()
        truth = settle(settings, final_graph(client, "slow_start"))

    assert tally(tmp_path, "slow_start", "stalled") >= 1  # once per task of its first batch with live rows
    versions = [Version("count_per_key", 10_000, count_and_total), Version("slow_start", 10_000, count_and_total)]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic),
        truth.on_time,
        versions,
        [truth.cut(done)],
        truth.closed_until,
    )


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
        truth = settle(settings, final_graph(client, "max_per_key_30s"))

    assert truth.cut(client.journal.get(swap.id)) == cut
    assert cut % 30_000 == 0
    assert cut >= before
    results = read_results(settings.kafka, settings.sink_topic)
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
        results_before = {r.key: r.row for r in read_results(settings.kafka, settings.sink_topic)}
        # Twenty events for windows the old query already answered, long after the cut.
        late_spec = GeneratorSpec(rate=1000, keys=2, seed=99, count=20, start_ts=cut - 25_000)
        produce(settings.kafka, late_spec, settings.source_topic)
        wait_until(lambda: client.status().late_records >= 20, 60, "late records to be counted")
        assert client.status().late_records == 20
    late = read_topic(settings, settings.names.late_topic)
    assert len(late) == 20
    assert all(int(json.loads(r.value)["ts"]) < cut for r in late)
    # The old version's answers are untouched: nothing re-opened a window at or before W.
    after = {r.key: r.row for r in read_results(settings.kafka, settings.sink_topic) if r.window_end <= cut}
    assert after == {k: v for k, v in results_before.items() if v["window_end"] <= cut}
    assert swap.state is SwapPhase.COMPLETED


def test_a_deploy_that_takes_10s_leaves_the_loop_its_cadence(
    settings: Settings, spark: SparkSession, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    """While a new query takes 10 s to start, the executor's loop keeps running: on a quiet source the
    idle watermark keeps moving on its tick (every second), and the serving graph keeps closing each
    window the watermark passes, within seconds, as its progress reports say."""
    quiet = changed(settings, idle_timeout="2s")
    keys = Keys(quiet.namespace)
    spec = GeneratorSpec(rate=300, keys=3, seed=10, time_scale=10, start_ts=T0)
    # (monotonic s, service watermark, the serving graph's committed watermark)
    samples: list[tuple[float, int | None, int]] = []
    with executor_running(quiet, spark, COUNT_10S):
        with continuous_load(quiet, spec):
            wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        wait_until(lambda: all(p.idle for p in client.status().service.partitions.values()), 60, "an idle source")
        swap = client.submit(slow_to_start(tmp_path, 10))

        def deployed() -> bool:
            progress = read_progress(control, keys, "count_per_key")
            committed = (progress.committed_watermark or 0) if progress else 0
            samples.append((time.monotonic(), read_service_state(control, keys).watermark, committed))
            return client.journal.get(swap.id).state not in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING)

        wait_until(deployed, 120, "the slow query to deploy", interval_s=0.1)
        done = client.wait_until_done(swap.id, 120)

    deploy_s = phase_at(done, SwapPhase.DEPLOYED) - phase_at(done, SwapPhase.DEPLOYING)
    moves = [t for (t, w, _), (_, before, _) in zip(samples[1:], samples, strict=False) if w != before]
    watermark_gap = max(b - a for a, b in zip([samples[0][0], *moves], [*moves, samples[-1][0]], strict=True))
    # How long each window end the service watermark passed waited for the serving graph to report
    # it closed (up to the last sample for one still open): a window is 10 s, so a loop blocked by the
    # deploy leaves one waiting about 10 s.
    close_lag = 0.0
    for at, watermark, _ in samples:
        window_end = (watermark or 0) // 10_000 * 10_000
        closed = next((t for t, _, committed in samples if t >= at and committed >= window_end), samples[-1][0])
        close_lag = max(close_lag, closed - at)
    print(
        f"deploy {deploy_s:.1f}s over {samples[-1][0] - samples[0][0]:.1f}s sampled: the idle watermark moved "
        f"{len(moves)} times (largest gap {watermark_gap:.2f}s), a passed window waited at most {close_lag:.2f}s "
        "to be reported closed"
    )
    assert deploy_s >= 10
    # A loop blocked by the deploy would leave gaps of 10 s; on its 0.25 s tick the watermark moves every second.
    assert watermark_gap < 4, watermark_gap
    assert close_lag < 6, close_lag
    assert len(moves) >= 5
