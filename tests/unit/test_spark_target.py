"""Where the executor runs Spark: `--spark-master` reaches the session, and Spark Connect is refused
at start with one line, before the executor touches Redis (README, "Running on a cluster")."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, NoReturn

import fakeredis
import pyspark
import pytest
import typer
from typer.testing import CliRunner

from hotswap.contract.errors import ConfigError
from hotswap.contract.settings import Settings, SparkSettings, load_settings
from hotswap.executor.control import spark_session
from hotswap.executor.control.spark_session import (
    LOCAL_CHECKPOINT_CONF,
    check_spark_target,
    class_archive,
    is_local_master,
    session_conf,
)
from hotswap.executor.errors import SparkConnectUnsupported
from hotswap.executor.operator import cli, client


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("SPARK_REMOTE", "SPARK_API_MODE", "HOTSWAP_SPARK_MASTER", "HOTSWAP_SPARK_REMOTE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOTSWAP_CONFIG_FILE", str(tmp_path / "absent.toml"))


@pytest.fixture
def query(tmp_path: Path) -> Path:
    path = tmp_path / "q.sql"
    path.write_text("SELECT key FROM events", encoding="utf-8")
    return path


def test_a_spark_remote_that_is_not_a_connect_url_is_a_one_line_settings_error() -> None:
    with pytest.raises(ConfigError, match=r"spark_remote: .*not a Spark Connect URL"):
        load_settings(spark_remote="spark://127.0.0.1:7077")


def test_run_with_spark_remote_is_refused_with_one_line_before_redis_is_touched(
    monkeypatch: pytest.MonkeyPatch, query: Path
) -> None:
    def no_redis(*_: Any, **__: Any) -> NoReturn:
        raise AssertionError("the refusal must come before any Redis call")

    monkeypatch.setattr(client, "redis_client", no_redis)
    result = CliRunner().invoke(cli.app, ["run", "--query", str(query), "--spark-remote", "sc://spark.example:15002"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("hotswap: Spark Connect is not supported (--spark-remote sc://spark.example:15002)")
    assert "--spark-master" in lines[0]


@pytest.mark.parametrize(
    ("settings", "env"),
    [
        (Settings(spark_conf={"spark.remote": "sc://h:15002"}), {}),
        (Settings(spark_conf={"spark.api.mode": "connect"}), {}),
        (Settings(), {"SPARK_REMOTE": "sc://h:15002"}),
        (Settings(), {"SPARK_API_MODE": "Connect"}),
        (Settings(spark_master="sc://h:15002"), {}),
    ],
    ids=["spark.remote", "spark.api.mode", "SPARK_REMOTE", "SPARK_API_MODE", "sc-master"],
)
def test_every_way_into_spark_connect_is_refused(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, env: dict[str, str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SparkConnectUnsupported, match="Spark Connect is not supported"):
        check_spark_target(settings.spark)


def test_classic_masters_are_accepted() -> None:
    for master in ("local[2]", "local[*]", "spark://127.0.0.1:7077", "k8s://https://10.0.0.1:6443", "yarn"):
        check_spark_target(Settings(spark_master=master, spark_conf={"spark.api.mode": "classic"}).spark)


def test_run_passes_spark_master_to_the_session(monkeypatch: pytest.MonkeyPatch, query: Path) -> None:
    server = fakeredis.FakeServer()
    monkeypatch.setattr(client, "redis_client", lambda *args, **kwargs: fakeredis.FakeRedis(server=server))
    monkeypatch.setenv("HOTSWAP_REDIS_MAY_LOSE_WRITES", "true")  # fakeredis has no CONFIG GET to read
    seen: list[SparkSettings] = []

    def fake_session(settings: SparkSettings) -> NoReturn:
        seen.append(settings)
        raise typer.Exit(3)

    monkeypatch.setattr(spark_session, "build_spark_session", fake_session)
    result = CliRunner().invoke(
        cli.app, ["run", "--query", str(query), "--spark-master", "spark://127.0.0.1:47077", "--lease-wait", "0s"]
    )
    assert result.exit_code == 3, result.output
    assert [s.spark_master for s in seen] == ["spark://127.0.0.1:47077"]


def test_the_driver_binds_to_loopback_only_in_local_mode() -> None:
    for master in ("local", "local[2]", "local[*]", "local-cluster[2,1,1024]"):
        assert is_local_master(master)
    assert not is_local_master("spark://10.0.0.5:7077")
    local = session_conf(Settings(spark_master="local[*]").spark)
    cluster = session_conf(Settings(spark_master="spark://10.0.0.5:7077").spark)
    assert local["spark.driver.host"] == "127.0.0.1"
    assert "spark.driver.host" not in cluster
    assert "spark.driver.bindAddress" not in cluster
    # An operator's own conf still wins, on a cluster as locally.
    pinned = session_conf(Settings(spark_master="spark://h:7077", spark_conf={"spark.driver.host": "10.0.0.9"}).spark)
    assert pinned["spark.driver.host"] == "10.0.0.9"


def test_a_driver_maps_in_the_class_data_archive_only_when_stack_fetch_dumped_one(tmp_path: Path) -> None:
    settings = Settings(jars_dir=tmp_path)
    assert "SharedArchiveFile" not in session_conf(settings.spark)["spark.driver.extraJavaOptions"]
    archive = class_archive(settings.jar_cache)
    assert archive.parent == tmp_path
    archive.write_bytes(b"classes")
    options = session_conf(settings.spark)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-XX:+UseSerialGC" in options  # the archive is for the driver's own GC


def test_checkpoints_on_this_machine_are_renamed_without_forks_and_elsewhere_keep_sparks_default() -> None:
    key = "spark.sql.streaming.checkpointFileManagerClass"
    local = session_conf(Settings().spark)
    assert local[key] == LOCAL_CHECKPOINT_CONF[key]
    on_s3 = session_conf(Settings(checkpoint_root="s3a://bucket/hotswap").spark)
    assert key not in on_s3
    assert on_s3["spark.hadoop.fs.s3a.path.style.access"] in ("true", "false")
    # On a cluster a path without a scheme may be HDFS's, whose rename does not replace a file.
    assert key not in session_conf(Settings(spark_master="spark://10.0.0.5:7077").spark)
    # An operator's own conf still wins.
    pinned = session_conf(Settings(spark_conf={key: "com.example.Manager"}).spark)
    assert pinned[key] == "com.example.Manager"


def test_the_checkpoint_file_manager_named_is_in_the_pinned_spark() -> None:
    # Its package moved between Spark versions; a name that does not load fails every query at start.
    jars = Path(pyspark.__file__).parent / "jars"
    name = LOCAL_CHECKPOINT_CONF["spark.sql.streaming.checkpointFileManagerClass"].replace(".", "/") + ".class"
    holders = []
    for jar in jars.glob("spark-sql_*.jar"):
        with zipfile.ZipFile(jar) as archive:
            if name in archive.namelist():
                holders.append(jar)
    assert holders, f"{name} is in no spark-sql jar under {jars}"
