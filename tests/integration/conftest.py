"""Session-wide real services: one Kafka broker, one Redis, one SparkSession.

Kafka comes from HOTSWAP_KAFKA_BOOTSTRAP when set, from testcontainers when a Docker engine
answers, and from the embedded stack otherwise (on its own ports, so a running demo is left
alone). Each test gets a fresh namespace and fresh topics.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from contract.settings import Settings
from executor.control.spark_session import build_spark_session
from executor.operator.client import Client, redis_client
from executor.stack import EmbeddedStack
from tests.integration.oracle import KEEP_EVERY_BATCH

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / ".hotswap" / "jars"
TEST_STACK_HOME = REPO / ".hotswap" / "test-stack"


@dataclass(frozen=True)
class Services:
    bootstrap: str
    redis_url: str
    stack: EmbeddedStack | None = None  # set when the embedded stack runs the services


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    external_kafka = os.environ.get("HOTSWAP_KAFKA_BOOTSTRAP")
    external_redis = os.environ.get("HOTSWAP_REDIS_URL")
    if external_kafka and external_redis:
        yield Services(external_kafka, external_redis)
        return
    if not external_kafka and _docker_answers():
        from testcontainers.community.kafka import KafkaContainer
        from testcontainers.community.redis import RedisContainer

        with KafkaContainer().with_kraft() as kafka, RedisContainer() as rds:
            host, port = rds.get_container_host_ip(), rds.get_exposed_port(6379)
            yield Services(kafka.get_bootstrap_server(), external_redis or f"redis://{host}:{port}/0")
        return
    settings = Settings(
        home=TEST_STACK_HOME,
        jars_dir=JARS,
        kafka_bootstrap=external_kafka,
        redis_url=external_redis,
        kafka_port=19092,
        kafka_controller_port=19093,
        redis_port=16379,
    )
    stack = EmbeddedStack(settings)
    stack.up(timeout_s=180)
    try:
        yield Services(settings.bootstrap, settings.redis_dsn, stack)
    finally:
        stack.down()


@pytest.fixture(scope="session")
def spark(services: Services) -> Iterator[SparkSession]:
    # One driver serves every in-process test: with 1 GiB its old generation reached 96% and full
    # GCs ran back to back late in the suite, stalling queries for minutes. 2 GiB leaves headroom.
    settings = Settings(
        jars_dir=JARS, kafka_bootstrap=services.bootstrap, spark_driver_memory="2g", spark_conf=KEEP_EVERY_BATCH
    )
    session = build_spark_session(settings)
    yield session
    session.stop()


@pytest.fixture
def settings(services: Services, tmp_path: Path) -> Settings:
    namespace = f"t{uuid.uuid4().hex[:8]}"
    return Settings(
        home=tmp_path / "home",
        jars_dir=JARS,
        kafka_bootstrap=services.bootstrap,
        redis_url=services.redis_url,
        namespace=namespace,
        source_topic=f"{namespace}.events",
        sink_topic=f"{namespace}.results",
        window="10s",
        lateness="2s",
        idle_timeout="60s",
    )


@pytest.fixture
def control(settings: Settings) -> Iterator[redis.Redis]:
    client = redis_client(settings)
    yield client
    client.close()


@pytest.fixture
def client(settings: Settings, control: redis.Redis) -> Client:
    return Client(settings, control)
