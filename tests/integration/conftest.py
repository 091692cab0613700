"""Session-wide real services: one Kafka broker, one Redis, one SparkSession.

Kafka and Redis come from HOTSWAP_KAFKA_BOOTSTRAP and HOTSWAP_REDIS_URL when both are set. Else
HOTSWAP_TEST_SERVICES chooses: `containers` (Testcontainers, on the images `make images` builds),
`embedded` (the embedded stack), or `auto`, the default: containers when a Docker engine answers
and holds the images, the embedded stack otherwise. Both run on their own ports, so a running demo
is left alone. Each test gets a fresh namespace and fresh topics.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from hotswap.contract.settings import Settings
from hotswap.executor.control.spark_session import build_spark_session
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.stack import EmbeddedStack
from tests.conftest import wait_until
from tests.integration.harness import JARS, REPO, namespace_settings
from tests.integration.oracle import KEEP_EVERY_BATCH
from tests.integration.postgres import PostgresServer
from tests.integration.s3proxy import S3Proxy

TEST_STACK_HOME = REPO / ".hotswap" / "test-stack"
KAFKA_PORT, KAFKA_CONTROLLER_PORT, REDIS_PORT = 19092, 19093, 16379
ROUTES = ("auto", "containers", "embedded")


@dataclass(frozen=True)
class Services:
    bootstrap: str
    redis_url: str
    route: str  # "external", "containers" or "embedded"
    # Stops "kafka" or "redis" (SIGTERM, its data kept), starts it again and waits until it answers.
    # None when the services are external.
    restart: Callable[[str], None] | None = None
    # Kills Kafka and Redis together (SIGKILL, their data kept), keeps both away for that many
    # seconds, starts them again and waits until they answer. None when the services are external.
    outage: Callable[[float], None] | None = None


def _route() -> str:
    """Containers or the embedded stack, as HOTSWAP_TEST_SERVICES asks and this machine allows."""
    route = os.environ.get("HOTSWAP_TEST_SERVICES", "auto")
    if route not in ROUTES:
        raise pytest.UsageError(f"HOTSWAP_TEST_SERVICES={route!r}: use one of {', '.join(ROUTES)}")
    if route == "embedded":
        return route
    from tests.integration.containers import docker_answers, missing_images

    if not docker_answers():
        if route == "containers":
            raise pytest.UsageError("HOTSWAP_TEST_SERVICES=containers, but no Docker engine answers; start dockerd")
        return "embedded"
    missing = missing_images()
    if missing:
        if route == "containers":
            raise pytest.UsageError(f"the Docker engine lacks {', '.join(missing)}; run `make images`")
        return "embedded"
    return "containers"


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    external_kafka = os.environ.get("HOTSWAP_KAFKA_BOOTSTRAP")
    external_redis = os.environ.get("HOTSWAP_REDIS_URL")
    if external_kafka and external_redis:
        yield Services(external_kafka, external_redis, "external")
        return
    if not external_kafka and not external_redis and _route() == "containers":
        from tests.integration.containers import container_services

        with container_services(KAFKA_PORT, KAFKA_CONTROLLER_PORT, REDIS_PORT) as running:
            yield Services(running.bootstrap, running.redis_url, "containers", running.restart, running.outage)
        return
    settings = Settings(
        home=TEST_STACK_HOME,
        jars_dir=JARS,
        kafka_bootstrap=external_kafka,
        redis_url=external_redis,
        kafka_port=KAFKA_PORT,
        kafka_controller_port=KAFKA_CONTROLLER_PORT,
        redis_port=REDIS_PORT,
    )
    stack = EmbeddedStack(settings.stack, settings.kafka)
    stack.up(timeout_s=180)
    try:
        yield Services(
            settings.bootstrap,
            settings.redis_dsn,
            "embedded",
            lambda name: _restart(stack, name),
            lambda seconds: _outage(stack, seconds),
        )
    finally:
        stack.down()


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is dead too: it only waits for its parent to collect it.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def _restart(stack: EmbeddedStack, name: str) -> None:
    """SIGTERM one embedded service, wait until its process is gone, and start it again."""
    pid = next(s.pid for s in stack.status() if s.name == name)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: _process_gone(pid), 120, f"{name} to exit")
    stack.up()


def _outage(stack: EmbeddedStack, seconds: float) -> None:
    """SIGKILL the embedded broker and Redis together, wait `seconds`, and start both again."""
    began = time.monotonic()
    pids = [s.pid for s in stack.status() if s.name in ("kafka", "redis") and s.pid is not None]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(_process_gone(pid) for pid in pids), 60, "Kafka and Redis to die")
    time.sleep(max(0.0, seconds - (time.monotonic() - began)))  # the outage itself: nothing to poll for
    stack.up()


@pytest.fixture(scope="session")
def spark(services: Services) -> Iterator[SparkSession]:
    # One driver serves every in-process test: with 1 GiB its old generation reached 96% and full
    # GCs ran back to back late in the suite, stalling queries for minutes. 2 GiB leaves headroom.
    settings = Settings(
        jars_dir=JARS, kafka_bootstrap=services.bootstrap, spark_driver_memory="2g", spark_conf=KEEP_EVERY_BATCH
    )
    session = build_spark_session(settings.spark)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session, started by the first test that asks for it."""
    server = PostgresServer()
    server.start()
    yield server
    server.remove()


@pytest.fixture(scope="session")
def s3proxy() -> Iterator[S3Proxy]:
    """One S3 server (s3proxy on its filesystem backend) for the session, started by the first test that asks."""
    server = S3Proxy(JARS).start()
    yield server
    server.stop()


@pytest.fixture
def settings(services: Services, tmp_path: Path) -> Settings:
    return namespace_settings(tmp_path / "home", services.bootstrap, services.redis_url, "t")


@pytest.fixture
def control(settings: Settings) -> Iterator[redis.Redis]:
    client = redis_client(settings.control)
    yield client
    client.close()


@pytest.fixture
def client(settings: Settings, control: redis.Redis) -> Client:
    return Client(settings.control, settings.kafka, settings.pipeline, control)
