"""Issue 9: lost control state is refused, never absorbed, and a stalled executor is fenced off."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import redis
from kafka import KafkaProducer
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.names import STALLED, Keys
from hotswap.contract.settings import Settings
from hotswap.contract.status import GraphStatus
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import (
    REPO,
    ExecutorProcess,
    changed,
    committed_watermark,
    continuous_load,
    executor_running,
    fails_on_rows,
    final_graph,
    python_query,
    read_topic,
    tally,
)
from tests.integration.oracle import Version, assert_invariants, count_and_total, mean_and_n, peak_and_low, settle

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
AVERAGE_10S = REPO / "examples" / "average_per_key.py"
T0 = 1_700_000_000_000


def namespace_keys(control: redis.Redis, settings: Settings) -> list[bytes]:
    return list(control.scan_iter(match=f"{Keys(settings.namespace).prefix}:*"))


# FLUSHALL, as far as one namespace can tell: every key of it gone in one atomic step. Deleting them
# one by one would let a write that was legal (the namespace record still there) land after the scan.
_FLUSH = """
local keys = redis.call('KEYS', ARGV[1])
for i = 1, #keys, 1000 do
  redis.call('DEL', unpack(keys, i, math.min(i + 999, #keys)))
end
return #keys
"""


def flush_namespace(control: redis.Redis, settings: Settings) -> None:
    control.eval(_FLUSH, 0, f"{Keys(settings.namespace).prefix}:*")


def test_a_flushed_redis_stops_the_executor_with_one_line_and_reset_starts_over(
    settings: Settings, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    keys = Keys(settings.namespace)
    spec = GeneratorSpec(rate=300, keys=3, seed=51, disorder_ms=300, time_scale=10, start_ts=T0)
    with continuous_load(settings, spec) as load:
        first = ExecutorProcess(settings, COUNT_10S, tmp_path)
        try:
            first.wait_serving(control, keys)
            wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
            flush_namespace(control, settings)
            assert first.wait_exit(60) == 1
        finally:
            first.stop()
        log = first.log_path.read_text()
        assert "vanished from Redis" in log
        # Nothing was written from the reset state: not a plan, not a phase, not a report.
        assert namespace_keys(control, settings) == []

        # The load stops here: the reset run below starts over from a backlog of fixed size.
        load.stop()
        # A plain restart is refused: the checkpoints and topics are there, the journal is not.
        refused = ExecutorProcess(settings, COUNT_10S, tmp_path)
        assert refused.wait_exit(120) == 1
        refused.stop()
        refusal = refused.log_path.read_text()
        assert "--reset-namespace" in refusal
        assert "spark.connector" not in refusal  # refused before Spark starts, not seconds after

        # The documented recovery: start the namespace over from the source's first offset.
        again = ExecutorProcess(settings, COUNT_10S, tmp_path, args=("--reset-namespace", "--yes"))
        try:
            again.wait_serving(control, keys)
            wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 40_000, 180, "windows again")
            truth = settle(settings, final_graph(client, "count_per_key"))
        finally:
            again.stop()
    # Both runs wrote the windows they closed; each (window, key) has one value under one key.
    versions = [Version("count_per_key", 10_000, count_and_total)]
    results = read_results(settings.kafka, settings.sink_topic)
    assert_invariants(results, truth.on_time, versions, [], truth.closed_until, allow_redelivery=True)


def test_an_executor_stalled_past_its_lease_during_a_drain_is_fenced_off_and_its_successor_serves_on(
    settings: Settings, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    """Only the executor's Python process stalls (its Spark JVM runs on, on the same checkpoints),
    during a drain: the successor takes over without dying of those checkpoints, the stalled one
    exits 1 when it wakes, and the swap completes."""
    keys = Keys(settings.namespace)
    spec = GeneratorSpec(rate=300, keys=3, seed=52, disorder_ms=300, time_scale=10, start_ts=T0)
    with continuous_load(settings, spec) as load:
        stalled = ExecutorProcess(settings, COUNT_10S, tmp_path)
        successor: ExecutorProcess | None = None
        try:
            stalled.wait_serving(control, keys)
            wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
            swap = client.submit(MAX_30S)
            client.wait_for(swap.id, lambda r: r.state.is_past_cut, 120, "cut")
            stalled.process.send_signal(signal.SIGSTOP)  # a long GC pause, as far as Redis can tell
            # The successor waits for the stalled executor's lease (6 s here) to expire, then takes over.
            successor = ExecutorProcess(settings, COUNT_10S, tmp_path)
            successor.wait_serving(control, keys)
            stalled.process.send_signal(signal.SIGCONT)
            assert stalled.wait_exit(60) == 1
            assert "lost its lease" in stalled.log_path.read_text()
            holder = control.get(keys.lease)
            assert isinstance(holder, bytes)
            assert f":{successor.process.pid}:" in holder.decode()

            done = client.wait_until_done(swap.id, 180)
            assert successor.process.poll() is None  # it served on: no restart was needed
            assert "failed for good" not in successor.log_path.read_text()
            cut = int(done.cut_window_end or 0)
            wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 30_000, 120, "new windows")
            load.stop()
            truth = settle(settings, final_graph(client, "max_per_key_30s"))
        finally:
            stalled.process.send_signal(signal.SIGCONT)
            stalled.stop()
            if successor is not None:
                successor.stop()
    versions = [Version("count_per_key", 10_000, count_and_total), Version("max_per_key_30s", 30_000, peak_and_low)]
    cuts = [truth.cut(done)]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic),
        truth.on_time,
        versions,
        cuts,
        truth.closed_until,
        allow_redelivery=True,
    )


def test_a_completed_swap_and_a_running_one_are_rolled_back_under_load(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    spec = GeneratorSpec(rate=300, keys=3, seed=53, disorder_ms=300, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        completed = client.wait_until_done(client.submit(MAX_30S).id, 180)
        back = client.rollback(completed.id)
        assert back.to_query == "count_per_key-2"  # the previous query's text, from the journal
        back_done = client.wait_until_done(back.id, 180)

        running = client.submit(MAX_30S)
        client.wait_for(running.id, lambda r: r.state.is_past_cut, 120, "the cut")
        back_again = client.rollback(running.id)  # queued behind the swap it undoes
        back_again_done = client.wait_until_done(back_again.id, 240)
        final = back_again_done.to_query
        last_cut = int(back_again_done.cut_window_end or 0)
        wait_until(lambda: committed_watermark(client, final) >= last_cut + 30_000, 120, "windows after the rollback")
        load.stop()
        truth = settle(settings, final_graph(client, final))
        status = client.status()
    swaps = {s.id: s for s in status.swaps}
    assert swaps[completed.id].state is SwapPhase.ROLLED_BACK
    assert swaps[running.id].state is SwapPhase.ROLLED_BACK
    assert f"rolled back by {back.id}" in (swaps[completed.id].note or "")
    cuts = [truth.cut(client.journal.get(swap_id)) for swap_id in swaps]
    assert all(cut % 30_000 == 0 for cut in cuts)  # every cut, the rollbacks' included, is window-aligned
    assert [o.query_id for o in status.owners] == [
        "count_per_key",
        "max_per_key_30s",
        "count_per_key-2",
        running.to_query,
        final,
    ]
    versions = [
        Version("count_per_key", 10_000, count_and_total),
        Version("max_per_key_30s", 30_000, peak_and_low),
        Version(back_done.to_query, 10_000, count_and_total),
        Version(running.to_query, 30_000, peak_and_low),
        Version(final, 10_000, count_and_total),
    ]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, versions, cuts, truth.closed_until
    )


def test_a_query_failing_for_good_after_its_cut_is_rolled_back_and_then_fixed_forward_on_its_buffer(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    spec = GeneratorSpec(rate=300, keys=3, seed=54, disorder_ms=300, time_scale=10, start_ts=T0)
    failing_fast = changed(settings, query_restarts=1, query_restart_backoff="1s")

    def fails_after_its_cut(query: Path) -> SwapRecord:
        """The swap's query fails for good after its cut: during the drain (the swap fails) or after it
        completed, whichever comes first on this machine."""
        swap = client.submit(query)
        wait_until(lambda: client.status().graphs[swap.to_query].state is GraphState.FAILED, 180, "failed for good")
        return client.journal.get(swap.id)

    with executor_running(failing_fast, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        first = fails_after_its_cut(fails_on_rows(tmp_path, "scored"))
        assert first.cut_window_end is not None, first
        back = client.wait_until_done(client.rollback(first.id).id, 180)

        second = fails_after_its_cut(fails_on_rows(tmp_path, "scored_again"))
        assert second.cut_window_end is not None, second
        fixed = client.wait_until_done(client.submit(AVERAGE_10S, fix=second.id).id, 180)
        final = fixed.to_query
        wait_until(lambda: committed_watermark(client, final) >= int(fixed.cut_window_end or 0) + 30_000, 120, "fixed")
        load.stop()
        truth = settle(settings, final_graph(client, final))
        status = client.status()
    swaps = {s.id: s for s in status.swaps}
    assert swaps[first.id].state is SwapPhase.ROLLED_BACK
    assert back.to_query == "count_per_key-2"
    assert back.from_query == "scored"
    assert fixed.from_query == "scored_again"
    cuts = [truth.cut(client.journal.get(s.id)) for s in (first, back, second, fixed)]
    versions = [
        Version("count_per_key", 10_000, count_and_total),
        Version("scored", 10_000, count_and_total),
        Version("count_per_key-2", 10_000, count_and_total),
        Version("scored_again", 10_000, count_and_total),
        Version(final, 10_000, mean_and_n),
    ]
    # Every window after each W is answered once: by whoever took over the failed query's buffer.
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, versions, cuts, truth.closed_until
    )


def test_a_query_failing_on_a_live_row_after_its_cut_is_rolled_back_on_its_own(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    """`submit --auto-rollback`: a poison row after the cut, and nobody types `hotswap rollback`."""
    spec = GeneratorSpec(rate=300, keys=3, seed=61, disorder_ms=300, time_scale=10, start_ts=T0)
    failing_fast = changed(settings, query_restarts=1, query_restart_backoff="1s")

    def rolled_back(swap_id: str) -> SwapRecord | None:
        return next((s for s in client.journal.all() if s.rollback_of == swap_id), None)

    with executor_running(failing_fast, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        poisoned = client.submit(fails_on_rows(tmp_path, "poisoned"), auto_rollback=True)
        back = wait_until(lambda: rolled_back(poisoned.id), 180, "the automatic rollback")
        assert back is not None
        done = client.wait_until_done(back.id, 180)
        final = done.to_query
        wait_until(lambda: committed_watermark(client, final) >= int(done.cut_window_end or 0) + 30_000, 120, "after")
        load.stop()
        truth = settle(settings, final_graph(client, final))
    undone = client.journal.get(poisoned.id)
    assert undone.state is SwapPhase.ROLLED_BACK
    assert undone.cut_window_end is not None
    assert done.recovers == poisoned.id  # it took over the poisoned query's buffer
    assert done.cause is not None
    assert done.cause.startswith(f"automatic rollback of swap {poisoned.id}: query poisoned")
    assert "model server unreachable" in done.cause
    assert "\n" not in done.cause
    cuts = [truth.cut(client.journal.get(s.id)) for s in (poisoned, done)]
    versions = [
        Version("count_per_key", 10_000, count_and_total),
        Version("poisoned", 10_000, count_and_total),
        Version(final, 10_000, count_and_total),
    ]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, versions, cuts, truth.closed_until
    )


def test_a_batch_that_stalls_in_a_drain_is_cancelled_and_replayed_exactly_once(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    """`batch_stall_timeout`: the old graph's batch hangs after the cut (a task that never returns);
    the watch cancels it, the graph restarts from its checkpoint, the batch is replayed, and the
    drain ends with every window answered once."""
    hangs = python_query(
        tmp_path,
        "hangs_in_drain",
        # Armed by the test at the cut; the first row seen then hangs its task (counted first, so the
        # replay after the cancel goes through).
        on_live_row="if os.path.exists(os.path.join(STATE, 'armed')) and _tally('hung') == 0:\n    time.sleep(600)",
        live_from=0,
    )
    watched = changed(settings, batch_stall_timeout="8s", query_restart_backoff="1s")
    # Event time at wall-clock pace: the old graph receives rows for some seconds after the cut.
    spec = GeneratorSpec(rate=200, keys=3, seed=71, disorder_ms=300, time_scale=1, start_ts=T0)
    stalled = f"{STALLED}hangs_in_drain"
    with executor_running(watched, spark, hangs), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "hangs_in_drain") > T0 + 10_000, 120, "first windows")
        swap = client.submit(COUNT_10S)
        cut = client.wait_for(swap.id, lambda r: r.cut_window_end is not None, 120, "cut")
        (tmp_path / "hangs_in_drain.state" / "armed").touch()
        wait_until(lambda: client.counters().get(stalled, 0) >= 1, 120, "the hung batch to be cancelled")
        assert client.journal.get(swap.id).state.is_past_cut
        done = client.wait_until_done(swap.id, 180)
        wait_until(
            lambda: committed_watermark(client, "count_per_key") >= int(done.cut_window_end or 0) + 20_000,
            120,
            "windows after the cut",
        )
        load.stop()
        truth = settle(settings, final_graph(client, "count_per_key"))
    assert tally(tmp_path, "hangs_in_drain", "hung") >= 1
    assert done.state is SwapPhase.COMPLETED
    assert done.reason_code is None
    assert cut.cut_window_end == done.cut_window_end
    versions = [Version("hangs_in_drain", 10_000, count_and_total), Version("count_per_key", 10_000, count_and_total)]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic),
        truth.on_time,
        versions,
        [truth.cut(done)],
        truth.closed_until,
    )


def test_a_first_query_that_failed_for_good_on_a_row_is_replaced(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    """`hotswap replace FILE`: the namespace's first query fails for good on a poison row, with no swap
    to fix; the replacement takes over its input, and every window after its last is answered once."""
    poisoned = python_query(
        tmp_path,
        "poisoned_first",
        on_live_row="if os.path.exists(os.path.join(STATE, 'armed')):\n    raise RuntimeError('poison row')",
        live_from=0,
    )
    failing_fast = changed(settings, query_restarts=1, query_restart_backoff="1s")
    spec = GeneratorSpec(rate=300, keys=3, seed=73, disorder_ms=300, time_scale=10, start_ts=T0)

    def state() -> GraphState | None:
        graph = client.status().graphs.get("poisoned_first")
        return graph.state if graph else None

    with executor_running(failing_fast, spark, poisoned), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "poisoned_first") > T0 + 20_000, 120, "first windows")
        (tmp_path / "poisoned_first.state" / "armed").touch()
        wait_until(lambda: state() is GraphState.FAILED, 120, "the first query to fail for good")
        stopped = committed_watermark(client, "poisoned_first")
        done = client.wait_until_done(client.replace(COUNT_10S).id, 180)
        wait_until(
            lambda: committed_watermark(client, "count_per_key") >= int(done.cut_window_end or 0) + 30_000,
            120,
            "windows after the failure",
        )
        load.stop()
        truth = settle(settings, final_graph(client, "count_per_key"))
    assert done.replaces == "poisoned_first"
    assert done.from_query == "poisoned_first"
    assert done.cut_window_end == stopped - stopped % 10_000  # from the end of its last window
    versions = [Version("poisoned_first", 10_000, count_and_total), Version("count_per_key", 10_000, count_and_total)]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic),
        truth.on_time,
        versions,
        [truth.cut(done)],
        truth.closed_until,
    )


POISON_AWARE = """
-- count_per_key, failing on any row whose key is 'poison'
SELECT window.start AS window_start,
       window.end   AS window_end,
       key,
       count(*)     AS n,
       sum(CASE WHEN key = 'poison' THEN CAST(raise_error('poison row') AS BIGINT) ELSE value END) AS total
FROM events
GROUP BY window(event_time, '10 seconds'), key
"""


@pytest.mark.parametrize("engine", ["stateful", "closing"])
def test_a_serving_query_that_fails_on_a_row_dead_letters_that_batch_and_goes_on(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path, engine: str
) -> None:
    """`poison_batches = dead_letter`: the serving query fails for good on a poison row; that batch's
    rows go to the dead-letter topic, the query goes on without them, and every window is answered
    once, from every row but those."""
    query = tmp_path / "poison_aware.sql"
    query.write_text(POISON_AWARE)
    # The load's one key lands on partition 0; the poison row goes alone to partition 1, so it moves
    # no watermark of the load's. Partition 1 then holds the service watermark at the poison row until
    # it is idle again: a short idle timeout keeps that (and a closing graph's close of the poison's
    # window, which waits for it) to seconds.
    skipping = changed(
        settings,
        query_restarts=1,
        query_restart_backoff="1s",
        poison_batches="dead_letter",
        graph_engine=engine,
        idle_timeout="5s",
    )
    spec = GeneratorSpec(rate=300, keys=1, seed=79, disorder_ms=300, time_scale=10, start_ts=T0)

    def graph() -> GraphStatus:
        return client.status().graphs["poison_aware"]

    with executor_running(skipping, spark, query), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "poison_aware") > T0 + 20_000, 120, "first windows")
        # Ahead of the watermark by a few seconds of the clock (event time runs 10x): on time when it arrives.
        poison_ts = int(client.status().service.watermark or T0) + 40_000
        producer = KafkaProducer(**settings.kafka_python_config(), acks="all")
        body = {"key": "poison", "value": 1, "ts": poison_ts}
        producer.send(settings.source_topic, value=json.dumps(body).encode(), partition=1)
        producer.flush(timeout=30)
        producer.close(timeout=10)
        wait_until(lambda: graph().skipped_batches == 1, 120, "the poison batch to be skipped")
        wait_until(lambda: committed_watermark(client, "poison_aware") > poison_ts + 30_000, 120, "windows after it")
        load.stop()
        grid = 10_000 if engine == "closing" else None
        truth = settle(skipping, final_graph(client, "poison_aware"), closes_on_ms=grid)
    status = client.status()
    dead = [
        r
        for r in read_topic(settings, settings.names.dead_letter_topic)
        if r.headers.get("hotswap.reason_code") == b"poison_batch"
    ]
    assert any(json.loads(r.value)["key"] == "poison" for r in dead)
    assert status.dead_letters["poison_batch"] == len(dead)
    assert status.graphs["poison_aware"].state is GraphState.RUNNING
    skipped = {tuple(int(n) for n in r.headers["hotswap.source"].split(b"/")) for r in dead}
    kept = [e for e in truth.on_time if e.id not in skipped]
    versions = [Version("poison_aware", 10_000, count_and_total)]
    assert_invariants(read_results(settings.kafka, settings.sink_topic), kept, versions, [], truth.closed_until)
