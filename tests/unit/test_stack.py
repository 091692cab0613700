"""The embedded stack without starting anything: the broker's config, which Kafka connector Spark
gets, the state file that remembers the stack's processes, and what an operator reads on failure."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import psutil
import pytest

from hotswap.contract.settings import Settings
from hotswap.executor.control.spark_session import connector_conf, object_store_keys, session_conf
from hotswap.executor.errors import StackError
from hotswap.executor.spark_connector import (
    AVRO_VERSION,
    COMPLETE_MARKER,
    CONNECTOR_ARTIFACTS,
    DELTA_VERSION,
    OBJECT_STORE_ARTIFACTS,
    hadoop_version,
)
from hotswap.executor.stack import EmbeddedStack
from hotswap.executor.stack.kafka import KafkaBroker, cluster_of
from hotswap.executor.stack.process import (
    START_BANNER,
    Proc,
    ProcessState,
    failure_hint,
    is_ours,
    listens,
    started_after_boot,
    terminate_all,
)
from hotswap.executor.stack.redis import mask_url

NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("HOTSWAP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOTSWAP_CONFIG_FILE", str(tmp_path / "absent.toml"))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", jars_dir=tmp_path / "jars", kafka_port=29092, kafka_controller_port=29093)


# -- the broker's config ---------------------------------------------------------------------------
def test_broker_config_binds_the_configured_ports_and_keeps_its_data_under_home(settings: Settings) -> None:
    text = KafkaBroker(settings.stack, settings.kafka, settings.home).server_properties()
    pairs = [line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")]
    props = dict(pairs)
    assert len(props) == len(pairs), "a key is set twice"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["advertised.listeners"] == props["listeners"]
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:29093"
    assert props["process.roles"] == "broker,controller"
    assert props["log.dirs"] == str(settings.home / "kafka" / "data")
    # A single broker can hold only one replica: anything more and internal topics are never created.
    assert {key: value for key, value in props.items() if key.endswith("replication.factor")} == {
        key: "1" for key in props if key.endswith("replication.factor")
    }


def _props(broker: KafkaBroker) -> dict[str, str]:
    return dict(line.split("=", 1) for line in broker.server_properties().splitlines() if line and line[0] != "#")


def test_each_node_of_a_cluster_has_its_own_ports_and_data_and_lists_every_voter(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", kafka_brokers=3, kafka_port=49092, kafka_controller_port=49192)
    stack = EmbeddedStack(settings.stack, settings.kafka)
    home = settings.home.resolve()
    assert [broker.name for broker in stack.services] == ["kafka-1", "kafka-2", "kafka-3", "redis"]
    props = [_props(broker) for broker in stack.brokers]
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert props[1]["listeners"] == "PLAINTEXT://127.0.0.1:49093,CONTROLLER://127.0.0.1:49193"
    assert [p["log.dirs"] for p in props] == [str(home / "kafka-cluster" / f"node-{n}" / "data") for n in (1, 2, 3)]
    # One static quorum, the same on every node; no bootstrap servers (that is the single broker's dynamic quorum).
    voters = "1@127.0.0.1:49192,2@127.0.0.1:49193,3@127.0.0.1:49194"
    assert [p["controller.quorum.voters"] for p in props] == [voters] * 3
    assert not [p for p in props if "controller.quorum.bootstrap.servers" in p]
    # Kafka's internal topics survive the loss of one broker.
    assert {k: v for k, v in props[0].items() if k.endswith("replication.factor")} == {
        k: "3" for k in props[0] if k.endswith("replication.factor")
    }
    assert props[0]["transaction.state.log.min.isr"] == "2"


def test_the_nodes_of_a_cluster_share_one_cluster_id_and_keep_their_size(tmp_path: Path) -> None:
    three = Settings(home=tmp_path, kafka_brokers=3, kafka_controller_port=9192)
    first = cluster_of(three.stack, tmp_path)
    assert cluster_of(three.stack, tmp_path) == first  # a node formatted later joins the same cluster
    assert not first.startswith("-")
    with pytest.raises(StackError, match="has 3 brokers, not 5; set HOTSWAP_KAFKA_BROKERS=3"):
        cluster_of(Settings(home=tmp_path, kafka_brokers=5, kafka_controller_port=9192).stack, tmp_path)
    # A single broker is formatted alone, once: its id is never shared.
    assert cluster_of(Settings(home=tmp_path).stack, tmp_path) != first


def test_the_state_file_remembers_each_node_of_a_cluster(tmp_path: Path) -> None:
    state = ProcessState(tmp_path)
    procs = {f"kafka-{n}": Proc(100 + n, 1.0, ("kafka.Kafka", f"/h/node-{n}"), "") for n in (1, 2, 3)}
    state.write(procs)
    assert state.read() == procs


def test_postgresql_is_started_only_when_asked_and_remembered_once_started(tmp_path: Path) -> None:
    plain = Settings(home=tmp_path / "home")
    asked = Settings(home=tmp_path / "home", stack_postgres=True, postgres_port=35433)
    assert "postgres" not in [s.name for s in EmbeddedStack(plain.stack, plain.kafka).services]
    stack = EmbeddedStack(asked.stack, asked.kafka)
    assert [s.name for s in stack.services][-1] == "postgres"
    assert stack.postgres.url == "postgresql://hotswap@127.0.0.1:35433/postgres"
    state = ProcessState(tmp_path)
    procs = {"postgres": Proc(200, 1.0, ("postgres", "/h/postgres/data", "35433"), "")}
    state.write(procs)
    assert state.read() == procs  # `stack down` finds it, whatever the settings say now


# -- which connector Spark gets --------------------------------------------------------------------
def _connector_dir(settings: Settings) -> Path:
    directory = settings.jar_cache / f"spark-connector-{metadata.version('pyspark')}"
    directory.mkdir(parents=True)
    return directory


def _fill(directory: Path, artifacts: tuple[str, ...], complete: bool) -> None:
    for artifact in artifacts:
        (directory / f"{artifact}-1.2.3.jar").touch()
    (directory / "kafka-clients-test-1.2.3.jar").touch()  # not the artifact: no digit after its id
    if complete:
        (directory / COMPLETE_MARKER).write_text("done\n")


def test_spark_uses_the_fetched_connector_jars_when_the_jars_dir_holds_them(settings: Settings) -> None:
    directory = _connector_dir(settings)
    _fill(directory, CONNECTOR_ARTIFACTS, complete=True)
    conf = connector_conf(settings.spark)
    assert conf == {"spark.jars": ",".join(str(directory / f"{a}-1.2.3.jar") for a in CONNECTOR_ARTIFACTS)}


@pytest.mark.parametrize(
    ("artifacts", "complete"),
    [
        ((), False),  # nothing fetched
        (CONNECTOR_ARTIFACTS, False),  # a fetch was interrupted before it finished
        (CONNECTOR_ARTIFACTS[:-1], True),  # a jar was deleted afterwards
    ],
    ids=["empty", "interrupted", "jar-missing"],
)
def test_spark_resolves_the_connector_itself_without_complete_local_jars(
    settings: Settings, artifacts: tuple[str, ...], complete: bool
) -> None:
    _fill(_connector_dir(settings), artifacts, complete)
    conf = connector_conf(settings.spark)
    version = metadata.version("pyspark")
    assert conf["spark.jars.packages"].split(",") == [
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}",
        f"org.apache.spark:spark-avro_2.13:{AVRO_VERSION}",
        f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}",
    ]
    assert Path(conf["spark.jars.ivy"]).is_relative_to(settings.home.resolve())  # not ~/.ivy2
    assert "spark.jars" not in conf


def test_checkpoints_on_s3a_load_hadoops_s3_client_and_its_settings(settings: Settings) -> None:
    store = Settings.model_validate(
        {
            **settings.model_dump(),
            "checkpoint_root": "s3a://bucket/prefix",
            "s3_endpoint": "http://127.0.0.1:9000",
            "s3_access_key": "key",
            "s3_secret_key": "secret",
        }
    )
    connector = _connector_dir(store)
    _fill(connector, CONNECTOR_ARTIFACTS, complete=True)
    conf = session_conf(store.spark)
    # Not fetched: Spark resolves hadoop-aws at the wheel's Hadoop version, beside the local connector jars.
    assert conf["spark.jars.packages"] == f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"
    assert conf["spark.jars"].count(",") == len(CONNECTOR_ARTIFACTS) - 1
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"  # the default with an endpoint
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"  # any region does for a store not AWS
    # The keys never enter Spark's conf (pyspark puts it on spark-submit's command line): they go to
    # the driver's Hadoop configuration once the session runs.
    assert "secret" not in json.dumps(conf)
    assert object_store_keys(store.spark) == {"fs.s3a.access.key": "key", "fs.s3a.secret.key": "secret"}
    s3 = store.jar_cache / f"hadoop-aws-{hadoop_version()}"
    s3.mkdir()
    _fill(s3, OBJECT_STORE_ARTIFACTS, complete=True)
    fetched = session_conf(store.spark)
    assert "spark.jars.packages" not in fetched
    assert fetched["spark.jars"].endswith(",".join(str(s3 / f"{a}-1.2.3.jar") for a in OBJECT_STORE_ARTIFACTS))
    # A local checkpoint root loads none of it.
    assert not any(key.startswith("spark.hadoop.fs.s3a.") for key in session_conf(settings.spark))
    assert "hadoop-aws" not in session_conf(settings.spark)["spark.jars"]


# -- the state file and recognising our processes --------------------------------------------------
def _me() -> Proc:
    """This test process, described the way the stack describes a service it started."""
    started = started_after_boot(os.getpid())
    assert started is not None
    return Proc(os.getpid(), started, (psutil.Process().cmdline()[0],), "")


def test_the_state_file_round_trips_and_ignores_what_it_cannot_read(tmp_path: Path) -> None:
    state = ProcessState(tmp_path)
    procs = {"kafka": Proc(101, 12.34, ("kafka.Kafka", "/h/server.properties"), "/h/kafka.log"), "redis": _me()}
    state.write(procs)
    assert state.read() == procs
    # An entry in another shape (say, edited by hand) is dropped, the rest is kept.
    other = {"pid": 101, "start_ticks": 5, "markers": ["kafka.Kafka"]}
    state.path.write_text(json.dumps({"kafka": other, "redis": procs["redis"].to_json()}))
    assert state.read() == {"redis": procs["redis"]}
    state.path.write_text("{not json")
    assert state.read() == {}
    state.path.unlink()
    assert state.read() == {}


def test_an_entry_is_ours_only_while_pid_start_and_command_line_all_match() -> None:
    me = _me()
    assert is_ours(me)
    assert not is_ours(replace(me, started_s=me.started_s + 60))  # the pid now belongs to another process
    assert not is_ours(replace(me, markers=("kafka.Kafka",)))  # some other command
    assert not is_ours(replace(me, pid=NO_SUCH_PID))
    assert ProcessState(Path("/nonexistent")).live() == {}


def test_the_nodes_of_a_cluster_are_stopped_together(tmp_path: Path) -> None:
    # All get SIGTERM at once and exit on it: none is left for the SIGKILL after the grace.
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"node-{n}"]) for n in (1, 2, 3)]
    try:
        procs: list[Proc] = []
        for child in children:
            started = started_after_boot(child.pid)
            assert started is not None
            procs.append(Proc(child.pid, started, (f"node-{len(procs) + 1}",), ""))
        terminate_all(procs, grace_s=5.0)
        assert not [proc for proc in procs if is_ours(proc)]
        assert [child.wait(timeout=5) for child in children] == [-15, -15, -15]  # SIGTERM, not SIGKILL
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_listening_is_checked_per_process_and_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listens(os.getpid(), port)
        assert not listens(os.getpid(), port + 1 if port < 65535 else port - 1)
        assert not listens(NO_SUCH_PID, port)
    assert not listens(os.getpid(), port)


# -- what the operator reads -----------------------------------------------------------------------
def test_failure_hint_names_the_first_exception_of_the_last_start(tmp_path: Path) -> None:
    log = tmp_path / "kafka.log"
    log.write_text(
        "java.lang.IllegalStateException: an old failure, already fixed\n"
        f"{START_BANNER} Kafka at 2025-01-01 00:00:00 ---\n"
        "[2025-01-01 00:00:01] INFO starting (kafka.server.KafkaRaftServer)\n"
        "org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:9092\n"
        "\tat kafka.network.Acceptor.openServerSocket(SocketServer.scala:700)\n"
        "Caused by: java.net.BindException: Address already in use\n"
    )
    assert (
        failure_hint(str(log))
        == "org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:9092"
    )
    log.write_text(
        f"{START_BANNER} Kafka at 2025-01-01 00:00:00 ---\n"
        "Invalid maximum heap size: -Xmx12q\n"
        "Error: Could not create the Java Virtual Machine.\n"
        "Error: A fatal exception has occurred. Program will exit.\n"
    )
    assert failure_hint(str(log)) == "Invalid maximum heap size: -Xmx12q"
    assert failure_hint(str(tmp_path / "absent.log")) == ""


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://app:s3cret@db:6379/0", "redis://app:***@db:6379/0"),
        ("rediss://s3cret@db:6380", "rediss://***@db:6380"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_redis_addresses_are_shown_without_their_password(url: str, shown: str) -> None:
    assert mask_url(url) == shown
