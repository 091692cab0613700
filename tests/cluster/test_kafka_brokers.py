"""Issue 12: three Kafka brokers in separate processes, one of them killed during a swap's drain.

hotswap's own topics have three replicas and min.insync.replicas 2, so every write it makes is on
two brokers before it is acknowledged. The broker that leads the old graph's topic is SIGKILLed
while the swap drains; the swap must complete on the two left, and every invariant must hold.

The cluster is the embedded stack with `kafka_brokers=3` (its own ports and Redis, apart from the
integration tests' stack), and the executor runs as its own process, as in production.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.stack import EmbeddedStack
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import (
    JARS,
    REPO,
    ExecutorProcess,
    committed_watermark,
    continuous_load,
    final_graph,
    namespace_settings,
)
from tests.integration.oracle import Version, assert_invariants, count_and_total, peak_and_low, settle

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.slow]

CLUSTER_HOME = REPO / ".hotswap" / "cluster-stack"
COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
T0 = 1_700_000_000_000
BROKERS = 3
BEFORE_DRAIN = (SwapPhase.SUBMITTED, SwapPhase.VALIDATED, SwapPhase.DEPLOYING, SwapPhase.DEPLOYED, SwapPhase.CUT)
VERSIONS = [Version("count_per_key", 10_000, count_and_total), Version("max_per_key_30s", 30_000, peak_and_low)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedStack]:
    """Three combined KRaft nodes (brokers 2409x, controllers 2419x) and a Redis (24379), started
    afresh and stopped when the module ends, so their memory is free for the rest of the suite."""
    settings = Settings(
        home=CLUSTER_HOME,
        jars_dir=JARS,
        kafka_brokers=BROKERS,
        kafka_port=24092,
        kafka_controller_port=24192,
        kafka_heap="256m",
        redis_port=24379,
    )
    stack = EmbeddedStack(settings.stack, settings.kafka)
    stack.down()  # whatever an interrupted run left behind
    shutil.rmtree(CLUSTER_HOME, ignore_errors=True)
    stack.up(timeout_s=240)
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture
def settings(cluster: EmbeddedStack, tmp_path: Path) -> Settings:
    return namespace_settings(
        tmp_path / "home",
        cluster.settings.bootstrap,
        cluster.settings.redis_dsn,
        "c",
        topic_replication_factor=BROKERS,
        topic_min_insync_replicas=2,
    )


def partitions_of(settings: Settings, topic: str) -> list[dict[str, Any]]:
    """Each partition's leader, replicas and in-sync replicas, as the cluster reports them now."""
    admin = KafkaAdminClient(**settings.kafka_python_config())
    try:
        (described,) = admin.describe_topics([topic])
    finally:
        admin.close()
    return list(described["partitions"])


def min_insync_replicas(settings: Settings, topic: str) -> str:
    admin = KafkaAdminClient(**settings.kafka_python_config())
    try:
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        admin.close()
    return str(configs["topic"][topic]["min.insync.replicas"]["value"])


def pid_of(stack: EmbeddedStack, node: int) -> int:
    pid = next(s.pid for s in stack.status() if s.name == f"kafka-{node}")
    assert pid is not None, f"Kafka node {node} is not running"
    return pid


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")  # a zombie is dead too: it only waits to be collected
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def phase_at(record: SwapRecord, phase: SwapPhase) -> int:
    return next(p.at for p in record.phases if p.name is phase)


def test_a_broker_killed_during_the_drain_leaves_every_invariant_intact(
    cluster: EmbeddedStack, settings: Settings, tmp_path: Path
) -> None:
    control: redis.Redis = redis_client(settings.control)
    client = Client(settings.control, settings.kafka, settings.pipeline, control)
    keys = Keys(settings.namespace)
    old_topic = settings.names.graph_topic("count_per_key")
    hotswaps_topics = [
        settings.source_topic,
        settings.sink_topic,
        settings.names.late_topic,
        settings.names.dead_letter_topic,
        old_topic,
    ]
    spec = GeneratorSpec(rate=300, keys=3, seed=120, disorder_ms=500, time_scale=10, start_ts=T0)
    # The executor starts first: it creates the missing source topic with hotswap's replication (the
    # generator's producer would have it auto-created with the brokers' defaults).
    executor = ExecutorProcess(settings, COUNT_10S, tmp_path)
    try:
        executor.wait_serving(control, keys)
        with continuous_load(settings, spec) as load:
            wait_until(lambda: committed_watermark(client, "count_per_key") >= T0 + 10_000, 180, "first windows")
            for topic in hotswaps_topics:
                assert all(len(p["replica_nodes"]) == BROKERS for p in partitions_of(settings, topic)), topic
                assert min_insync_replicas(settings, topic) == "2", topic

            swap = client.submit(MAX_30S)
            # Polled often: the drain lasts a few of the old graph's batches.
            wait_until(lambda: client.journal.get(swap.id).state not in BEFORE_DRAIN, 240, "the drain", 0.1)
            # The broker that leads the old graph's topic (its first partition, on a closing graph): its rows
            # and its end-of-window marker move.
            first = min(partitions_of(settings, old_topic), key=lambda p: int(p["partition_index"]))
            victim = int(first["leader_id"])
            pid = pid_of(cluster, victim)
            before_kill = client.journal.get(swap.id)
            os.kill(pid, signal.SIGKILL)
            killed_at = int(time.time() * 1000)
            wait_until(lambda: process_gone(pid), 30, f"Kafka node {victim} to die")

            done = client.wait_until_done(swap.id, 300)
            cut = int(done.cut_window_end or 0)
            new_topic = settings.names.graph_topic("max_per_key_30s")
            # The cluster runs on two brokers: the dead one is out of the in-sync replicas.
            assert all(victim not in p["isr_nodes"] for p in partitions_of(settings, new_topic))
            wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 60_000, 180, "new windows")
            load.stop()
            truth = settle(settings, final_graph(client, "max_per_key_30s"))
    finally:
        executor.stop()

    # The broker died while the old graph was still draining, not after.
    assert before_kill.state is SwapPhase.DRAINING, f"the broker was killed in {before_kill.state}, not draining"
    assert killed_at < phase_at(done, SwapPhase.DRAINED)
    assert [p.name for p in done.phases][-1] is SwapPhase.COMPLETED
    cut = truth.cut(client.journal.get(swap.id))
    # A result a producer re-sent after the broker died may appear twice, as the identical record
    # under the same key; anything else (a second value, a missing or misowned window) fails.
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic),
        truth.on_time,
        VERSIONS,
        [cut],
        truth.closed_until,
        allow_redelivery=True,
    )

    # The killed broker rejoins: started again, it catches up and is back in sync.
    cluster.up(timeout_s=180)
    wait_until(
        lambda: all(victim in p["isr_nodes"] for p in partitions_of(settings, settings.sink_topic)),
        120,
        f"Kafka node {victim} back in sync",
    )
    control.close()
