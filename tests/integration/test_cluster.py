"""Issue 12: the swap on a Spark standalone cluster.

`hotswap run --spark-master spark://...` runs as its own process, the Spark driver of an
application whose tasks run in two executor JVMs, one per worker. Three swaps under load must keep
every invariant, checked against the same offline recomputation as on local Spark (test_swap.py).
The checkpoints are on an S3 API (s3proxy, tests/integration/s3proxy.py), as on a cluster of several
machines, whose checkpoint root must be a store they all see: the driver and both executors write
them through Hadoop's S3 client, and the oracle reads Spark's offset logs from s3proxy's files.
The graphs run on the closing engine over a source of four partitions, so each graph's topic has
four, each read by a task of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from hotswap.contract.models import GraphEngine
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from tests.conftest import wait_until
from tests.integration.harness import ExecutorProcess, changed
from tests.integration.oracle import KEEP_EVERY_BATCH
from tests.integration.s3proxy import ACCESS_KEY, SECRET_KEY, S3Proxy, local_copy
from tests.integration.scenarios import COUNT_10S, assert_three_swaps_keep_every_invariant, three_swaps_under_load
from tests.integration.spark_cluster import EXECUTOR_CONF, WORKER_UI_PORTS, StandaloneCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def workers_running_executors(cluster: StandaloneCluster) -> int:
    """How many workers give a core to an application (each runs one executor of one core)."""
    state = cluster.state() or {}
    return sum(1 for worker in state.get("workers", []) if worker.get("coresused", 0) > 0)


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_bytes().decode(errors="replace").splitlines()[-lines:])


def read_partitions(settings: Settings, query_id: str, topic: str) -> dict[str, int]:
    """The end offset of each partition of its topic that the graph's last planned batch read
    (Spark's offset log: a line of version, a line of metadata, then one line per source)."""
    offsets = local_copy(settings.names.graph_checkpoint(query_id)) / "offsets"
    last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    sources = [json.loads(line) for line in (offsets / str(last)).read_text().splitlines()[2:]]
    return {p: int(o) for source in sources for p, o in source.get(topic, {}).items()}


def test_three_swaps_on_a_standalone_cluster_keep_every_invariant(
    settings: Settings, control: redis.Redis, spark_cluster: StandaloneCluster, s3proxy: S3Proxy, tmp_path: Path
) -> None:
    settings = changed(
        settings,
        graph_engine="closing",
        source_partitions=4,
        checkpoint_root=f"{s3proxy.bucket('checkpoints')}/{tmp_path.name}",
        s3_endpoint=s3proxy.endpoint,
        s3_access_key=ACCESS_KEY,
        s3_secret_key=SECRET_KEY,
    )
    client = Client(settings.control, settings.kafka, settings.pipeline, control)
    conf = {**KEEP_EVERY_BATCH, **EXECUTOR_CONF}
    executor = ExecutorProcess(
        settings,
        COUNT_10S,
        tmp_path / "logs",
        args=("--spark-master", spark_cluster.master_url),
        env={"HOTSWAP_SPARK_CONF": json.dumps(conf)},
    )
    try:
        executor.wait_serving(control, Keys(settings.namespace))
        wait_until(
            lambda: workers_running_executors(spark_cluster) == len(WORKER_UI_PORTS), 120, "an executor on each worker"
        )
        apps = [app["name"] for app in (spark_cluster.state() or {}).get("activeapps", [])]
        assert apps == [f"hotswap-{settings.namespace}"]
        run = three_swaps_under_load(settings, client)
    except BaseException:
        print(spark_cluster.describe())
        print(f"--- {executor.log_path}\n{tail(executor.log_path)}")
        raise
    finally:
        executor.stop()

    assert_three_swaps_keep_every_invariant(settings, client, run)
    # Every checkpoint, and hotswap's own files beside them, went to the S3 server, none to the local disk.
    stored = local_copy(settings.names.checkpoint_root)
    assert (stored / "journal-version").is_file()
    assert sorted(path.name for path in stored.iterdir() if path.name.startswith("graph-")) != []
    assert not (settings.home / "checkpoints").exists()
    # Tasks ran in the executor JVMs that both workers launched, not in the driver.
    worked = {
        path.relative_to(spark_cluster.root).parts[0]
        for path in spark_cluster.executor_logs()
        if "Finished task" in path.read_text(errors="replace")
    }
    assert worked == {f"worker-{index}" for index in range(len(WORKER_UI_PORTS))}
    # Each graph's topic has the source's four partitions, and its stream read every one of them:
    # Spark's Kafka source runs one task per topic partition in each batch.
    for query_id, graph in run.status.graphs.items():
        assert (graph.engine, graph.partitions) == (GraphEngine.CLOSING, 4), query_id
        read = read_partitions(settings, query_id, graph.topic)
        assert sorted(read) == ["0", "1", "2", "3"], f"{query_id} read {read}"
        assert all(offset > 0 for offset in read.values()), f"{query_id} read {read}"
