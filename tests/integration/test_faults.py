"""Issue 4: crashes, failing queries, bad queries and infrastructure faults on the real stack."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.names import Keys
from hotswap.contract.rewrites import read_rewrites
from hotswap.contract.settings import Settings
from hotswap.execution_graph.source import load_query_source
from hotswap.executor.errors import SubmitRejected
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.conftest import Services
from tests.integration.harness import (
    QUERIES,
    REPO,
    ExecutorProcess,
    changed,
    committed_watermark,
    continuous_load,
    executor_running,
    fails_to_start,
    final_graph,
    flaky,
    read_topic,
    run_cli,
    slow_to_deploy,
    tally,
)
from tests.integration.oracle import Truth, Version, assert_invariants, count_and_total, peak_and_low, settle
from tests.integration.scenarios import PHASES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
BAD = QUERIES / "bad"
T0 = 1_700_000_000_000
VERSIONS = [Version("count_per_key", 10_000, count_and_total), Version("max_per_key_30s", 30_000, peak_and_low)]


def check_two_versions(truth: Truth, client: Client, swap_id: str) -> None:
    cut = truth.cut(client.journal.get(swap_id))
    results = read_results(truth.settings.kafka, truth.settings.sink_topic)
    assert_invariants(results, truth.on_time, VERSIONS, [cut], truth.closed_until, allow_redelivery=True)


# -- crashes -----------------------------------------------------------------------------------------
# Each crash point and the phase the journal holds when the process dies there: after every write of
# the swap, and between each write and the action it records.
CRASHES = [
    ("after:validated", SwapPhase.VALIDATED),  # validated, with its graph record, in one write
    ("after:deploying", SwapPhase.DEPLOYING),  # recorded; the new query not started
    ("before:deployed", SwapPhase.DEPLOYING),  # the new query runs; `deployed` not written yet
    ("after:deployed", SwapPhase.DEPLOYED),
    ("after:cut", SwapPhase.CUT),  # in the service graph's batch or tick
    ("after:draining", SwapPhase.DRAINING),
    ("after:drained", SwapPhase.DRAINED),
    ("after:retiring", SwapPhase.RETIRING),  # recorded; the old query not stopped yet
    ("after:old-stopped", SwapPhase.RETIRING),  # the old query stopped; `retired` not written yet
    ("after:retired", SwapPhase.RETIRED),
]


def test_executor_killed_in_each_swap_phase_resumes_and_keeps_every_invariant(
    settings: Settings, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    keys = Keys(settings.namespace)
    # 100 events a second: the load runs through eleven cold starts, and each restarted executor begins
    # with the backlog its predecessors left; event time still moves 10 s a second, so windows close as often.
    spec = GeneratorSpec(rate=100, keys=3, seed=31, disorder_ms=500, time_scale=10, start_ts=T0)
    with continuous_load(settings, spec) as load:
        process = ExecutorProcess(settings, COUNT_10S, tmp_path, crash_at=CRASHES[0][0])
        process.wait_serving(control, keys)
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        swap = client.submit(MAX_30S)
        for i, (point, phase) in enumerate(CRASHES):
            # SIGKILL, exactly after the phase was recorded: no clean-up ran.
            assert process.wait_exit(180) == -signal.SIGKILL, f"no crash at {point}; see {process.log_path}"
            assert client.journal.get(swap.id).state is phase
            next_point = CRASHES[i + 1][0] if i + 1 < len(CRASHES) else None
            process = ExecutorProcess(settings, COUNT_10S, tmp_path, crash_at=next_point)
        try:
            process.wait_serving(control, keys)
            done = client.wait_until_done(swap.id, 180)
            cut = int(done.cut_window_end or 0)
            wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 60_000, 120, "new windows")
            load.stop()
            truth = settle(settings, final_graph(client, "max_per_key_30s"))
        finally:
            process.stop()
    # The cut recorded before a crash was never re-decided, and each phase was recorded once.
    assert done.cut_batch is not None
    assert [p.name for p in done.phases] == PHASES
    check_two_versions(truth, client, swap.id)


def test_a_batch_killed_mid_write_is_replayed_and_counted_once(
    settings: Settings, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    keys = Keys(settings.namespace)
    spec = GeneratorSpec(rate=300, keys=3, seed=32, disorder_ms=300, time_scale=10, start_ts=T0)
    with continuous_load(settings, spec) as load:
        first = ExecutorProcess(settings, COUNT_10S, tmp_path)
        first.wait_serving(control, keys)
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        first.stop()
        # Rows of the next batch reach the graph's topic, then the process dies before Spark commits.
        crashing = ExecutorProcess(settings, COUNT_10S, tmp_path, crash_at="service:after-write")
        assert crashing.wait_exit(180) == -signal.SIGKILL
        last = ExecutorProcess(settings, COUNT_10S, tmp_path)
        try:
            last.wait_serving(control, keys)
            reached = committed_watermark(client, "count_per_key") + 40_000
            wait_until(lambda: committed_watermark(client, "count_per_key") >= reached, 120, "windows after the crash")
            load.stop()
            truth = settle(settings, final_graph(client, "count_per_key"))
        finally:
            last.stop()
    routes = [
        r.headers["hotswap.route"].decode().split(",")
        for r in read_topic(settings, settings.names.graph_topic("count_per_key"))
    ]
    ids = [(int(route[1]), int(route[2])) for route in routes if route[0] == "data"]
    assert len(ids) > len(set(ids)), "the replayed batch should have written some rows twice"
    # The replay recorded its rows' event times (the closing graph deduplicates the windows they reach).
    rewrites = read_rewrites(control, keys)
    assert rewrites, "the replayed batch should have recorded its rewrite"
    assert all(r.until_ms is not None for r in rewrites.values()), rewrites
    results = read_results(settings.kafka, settings.sink_topic)
    assert_invariants(results, truth.on_time, VERSIONS[:1], [], truth.closed_until, allow_redelivery=True)


def test_a_second_executor_on_the_namespace_is_refused(settings: Settings, spark: SparkSession, tmp_path: Path) -> None:
    with executor_running(settings, spark, COUNT_10S):
        second = run_cli(settings, "run", "--query", str(COUNT_10S), HOTSWAP_LEASE_WAIT="0s")
    assert second.returncode == 1
    assert "another executor" in second.stderr
    assert "already runs this namespace" in second.stderr


# -- bad input ---------------------------------------------------------------------------------------
BAD_QUERIES = [
    ("syntax_error.sql", "does not analyse"),
    ("unknown_column.sql", "colour"),
    ("no_window_columns.sql", "no window_start column"),
    ("not_windowed.sql", "aggregates without an event-time window"),
    ("misaligned_window.sql", "share a boundary only every"),
    ("uneven_slide.sql", "which does not divide their size"),
    ("no_query_function.py", "defines no function query"),
    ("query_raises.py", "ValueError: model weights not found"),
    ("python_syntax_error.py", "syntax error"),
]


def test_bad_queries_are_rejected_with_their_reason_and_change_nothing(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    with executor_running(settings, spark, COUNT_10S):
        before = client.status()
        for name, reason in BAD_QUERIES:
            with pytest.raises(SubmitRejected) as rejected:
                client.submit(BAD / name)
            message = str(rejected.value)
            assert reason in message, f"{name}: {message}"
            assert "\n" not in message
        after = client.status()
    assert after.current == before.current
    assert set(after.graphs) == {"count_per_key"}
    assert [s.state for s in after.swaps] == [SwapPhase.REJECTED] * len(BAD_QUERIES)


def test_submit_of_a_missing_file_is_one_line_and_exits_1(settings: Settings, tmp_path: Path) -> None:
    result = run_cli(settings, "submit", str(tmp_path / "nope.sql"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"hotswap: query file {tmp_path / 'nope.sql'} does not exist"]


# -- failing queries ---------------------------------------------------------------------------------
def test_a_query_failing_before_the_cut_fails_the_swap_and_the_old_query_keeps_serving(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    spec = GeneratorSpec(rate=300, keys=3, seed=33, time_scale=10, start_ts=T0)
    query = fails_to_start(tmp_path)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec):
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        record = client.submit(query)
        ended = client.wait_for(record.id, lambda r: r.state.is_terminal, 120, "failed")
        reached = committed_watermark(client, "count_per_key")
        wait_until(lambda: committed_watermark(client, "count_per_key") > reached + 20_000, 120, "more old windows")
        status = client.status()
    assert ended.state is SwapPhase.FAILED
    assert ended.cut_window_end is None
    assert "cannot reach the feature store" in (ended.error or "")
    assert "the old query keeps serving" in (ended.error or "")
    assert status.current is not None
    assert status.current.query_id == "count_per_key"
    assert status.graphs["broken_start"].state is GraphState.DISCARDED  # it never served
    assert not read_topic(settings, settings.names.graph_topic("broken_start"))


def test_a_query_failing_after_the_cut_is_restarted_from_its_checkpoint(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    start = 1_800_000_000_000
    spec = GeneratorSpec(rate=300, keys=3, seed=34, disorder_ms=300, time_scale=10, start_ts=start)
    fast_restarts = changed(settings, query_restart_backoff="1s")
    query = flaky(tmp_path, failures=2)
    with executor_running(fast_restarts, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > start + 10_000, 120, "first windows")
        record = client.submit(query)
        done = client.wait_until_done(record.id, 240)
        cut = int(done.cut_window_end or 0)
        wait_until(lambda: committed_watermark(client, "flaky") >= cut + 30_000, 120, "windows of the flaky query")
        load.stop()
        truth = settle(settings, final_graph(client, "flaky"))
    assert tally(tmp_path, "flaky", "failures") == 2
    versions = [VERSIONS[0], Version("flaky", 10_000, count_and_total)]
    cuts = [truth.cut(done)]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic),
        truth.on_time,
        versions,
        cuts,
        truth.closed_until,
        allow_redelivery=True,
    )


def test_abort_works_until_the_cut(settings: Settings, spark: SparkSession, client: Client, tmp_path: Path) -> None:
    with executor_running(settings, spark, COUNT_10S):
        # `submit` returns once the swap is validated; its deploy then takes 10 s.
        deploying = client.submit(slow_to_deploy(tmp_path, 10))
        # Queued behind the deploy, the executor has not even validated this one yet.
        queued = client.journal.create(SwapRecord(id="queued", to_query="max", source=load_query_source(MAX_30S)))
        aborted = [client.abort(deploying.id), client.abort(queued.id)]
        wait_until(lambda: client.status().graphs[deploying.to_query].state is GraphState.DISCARDED, 120, "clean-up")
        current = client.status().current
        assert current is not None
        assert current.query_id == "count_per_key"
        # The namespace never saw an event: the next swap's cut has no window before it, so it completes.
        done = client.wait_until_done(client.submit(MAX_30S).id, 120)
        status = client.status()
    assert [a.state for a in aborted] == [SwapPhase.ABORTED, SwapPhase.ABORTED]
    assert [client.journal.get(s.id).state for s in (deploying, queued)] == [SwapPhase.ABORTED, SwapPhase.ABORTED]
    assert done.state is SwapPhase.COMPLETED
    assert done.cut_window_end == 0
    assert status.current is not None
    assert status.current.query_id == done.to_query


# -- infrastructure ----------------------------------------------------------------------------------
def test_a_redis_restart_during_a_swap_is_ridden_out(
    services: Services, settings: Settings, spark: SparkSession, client: Client
) -> None:
    if services.restart is None:
        pytest.skip("Redis is external here: the tests cannot restart it")
    spec = GeneratorSpec(rate=300, keys=3, seed=35, disorder_ms=300, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        record = client.submit(MAX_30S)
        client.wait_for(record.id, lambda r: r.state.is_past_cut, 120, "the cut")
        # Same data directory: the append-only file brings the control plane back.
        services.restart("redis")
        done = client.wait_until_done(record.id, 180)
        cut = int(done.cut_window_end or 0)
        wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 60_000, 120, "new windows")
        load.stop()
        truth = settle(settings, final_graph(client, "max_per_key_30s"))
    check_two_versions(truth, client, record.id)


def test_a_kafka_broker_restart_is_recovered_from(
    services: Services, settings: Settings, spark: SparkSession, client: Client
) -> None:
    if services.restart is None:
        pytest.skip("Kafka is external here: the tests cannot restart it")
    spec = GeneratorSpec(rate=300, keys=3, seed=36, disorder_ms=300, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        services.restart("kafka")
        record = client.submit(MAX_30S)
        done = client.wait_until_done(record.id, 240)
        cut = int(done.cut_window_end or 0)
        wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 60_000, 180, "new windows")
        load.stop()
        truth = settle(settings, final_graph(client, "max_per_key_30s"))
    check_two_versions(truth, client, record.id)


def test_a_redis_that_may_lose_acknowledged_writes_is_refused_unless_the_operator_opts_out(
    settings: Settings, tmp_path: Path
) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on this machine")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # It fsyncs once a second: a crash may lose the last second's acknowledged writes.
    lax_flags = ["--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--dir", str(tmp_path)]
    lax = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", *lax_flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"

        def answers() -> bool:
            try:
                return bool(redis.Redis.from_url(url).ping())
            except redis.ConnectionError:
                return False

        wait_until(answers, 30, "the lax Redis to answer")
        on_lax = changed(settings, redis_url=url)
        refused = run_cli(on_lax, "run", "--query", str(COUNT_10S))
        assert refused.returncode == 1, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert lines[0].startswith("hotswap: Redis may lose acknowledged writes (appendfsync everysec)")
        assert "HOTSWAP_REDIS_MAY_LOSE_WRITES=true" in lines[0]
        assert not redis.Redis.from_url(url).keys("*")  # refused before anything was written
    finally:
        lax.terminate()
        lax.wait(timeout=30)


def test_kafka_and_redis_away_together_after_a_cut_are_ridden_out_and_said_in_a_few_lines(
    services: Services, settings: Settings, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    if services.outage is None:
        pytest.skip("Kafka and Redis are external here: the tests cannot stop them")
    spec = GeneratorSpec(rate=300, keys=3, seed=37, disorder_ms=300, time_scale=10, start_ts=T0)
    # The lease outlives the outage (the default, 15 s, would not): an outage longer than the lease
    # stops the executor, in one line, for its supervisor to restart it (README, "Infrastructure").
    executor = ExecutorProcess(settings, COUNT_10S, tmp_path, env={"HOTSWAP_LEASE_TTL": "30s"})
    try:
        executor.wait_serving(control, Keys(settings.namespace))
        with continuous_load(settings, spec) as load:
            wait_until(lambda: committed_watermark(client, "count_per_key") >= T0 + 10_000, 120, "first windows")
            record = client.submit(MAX_30S)
            client.wait_for(record.id, lambda r: r.state.is_past_cut, 120, "the cut")
            before = len(executor.log_path.read_text().splitlines())
            services.outage(15)
            done = client.wait_until_done(record.id, 240)
            during = executor.log_path.read_text().splitlines()[before:]
            cut = int(done.cut_window_end or 0)
            wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 60_000, 180, "new windows")
            load.stop()
            truth = settle(settings, final_graph(client, "max_per_key_30s"))
    finally:
        executor.stop()
    check_two_versions(truth, client, record.id)
    # What the operator reads about the outage at info level: the executor's warnings and errors, and
    # its lines about Kafka or Redis (anything not JSON is a library or the JVM speaking).
    said = []
    for line in during:
        try:
            entry = json.loads(line)
        except ValueError:
            said.append(line)
            continue
        event = str(entry.get("event", ""))
        if entry.get("level") in ("warning", "error", "critical") or "Kafka" in event or "Redis" in event:
            said.append(f"{entry.get('level')}: {event} {entry.get('error', '')}")
    assert any("Redis unreachable" in line for line in said), "\n".join(said)  # it is said, not hidden
    assert len(said) <= 4, "\n".join(said)
