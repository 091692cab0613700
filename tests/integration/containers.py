"""Kafka and Redis for the integration tests in containers, through Testcontainers' modules.

The images are hotswap's own (compose/build-images, `make images`): the modules' defaults are
registry images, and this machine may reach no registry. Both containers use the host's network,
on the embedded test stack's ports, so every address is 127.0.0.1 as in the other routes.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Self

from testcontainers.community.kafka import KafkaContainer
from testcontainers.community.redis import RedisContainer
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from hotswap.executor.stack import kafka_answers, redis_answers

REPO = Path(__file__).resolve().parents[2]
LOCALHOST = "127.0.0.1"
START_TIMEOUT_S = 180
# compose/docker-compose.yml's cluster id: any fixed one will do for a broker that lives one session.
CLUSTER_ID = "aG90c3dhcC1jb21wb3NlIQ"


def image_versions() -> dict[str, str]:
    """The pinned versions of compose/.env (shell assignments)."""
    versions: dict[str, str] = {}
    for line in (REPO / "compose" / ".env").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            versions[name.strip()] = value.strip()
    return versions


def kafka_image() -> str:
    return f"hotswap/kafka:{image_versions()['KAFKA_VERSION']}"


def redis_image() -> str:
    return f"hotswap/redis:{image_versions()['REDIS_VERSION']}"


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def missing_images() -> list[str]:
    """Those of hotswap's test images that the Docker engine does not hold (`make images` builds them)."""
    missing = []
    for image in (kafka_image(), redis_image()):
        inspected = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30, check=False)
        if inspected.returncode != 0:
            missing.append(image)
    return missing


class HostKafkaContainer(KafkaContainer):
    """The module's Kafka container on hotswap/kafka: KRaft, host network, 127.0.0.1 advertised.

    The module starts its (Confluent) image on a command that waits for a start script, which it
    writes once the mapped port is known. On the host's network the port is known beforehand, so
    the broker is the container's first process: a restart's SIGTERM reaches it."""

    def __init__(self, image: str, port: int, controller_port: int) -> None:
        super().__init__(image=image, port=port, wait_strategy_check_string=r".*Kafka Server started.*")
        self.controller_port = controller_port
        # The Confluent settings of the module's constructor do not apply to this image; nor do
        # published ports on the host's network.
        self.env = {}
        self.ports = {}
        self.with_kwargs(network_mode="host")

    def configure(self) -> None:
        listeners = f"PLAINTEXT://{LOCALHOST}:{self.port},CONTROLLER://{LOCALHOST}:{self.controller_port}"
        settings = {
            "CLUSTER_ID": CLUSTER_ID,
            "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@{LOCALHOST}:{self.controller_port}",
            "KAFKA_LISTENERS": listeners,
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{LOCALHOST}:{self.port}",
            "KAFKA_HEAP_OPTS": "-Xmx384m -Xms384m",
        }
        for key, value in settings.items():
            self.with_env(key, value)

    def start(self, timeout: int = START_TIMEOUT_S) -> Self:
        self.configure()
        # The image's own start command, which the official apache/kafka image shares.
        self.with_command("/etc/kafka/docker/run")
        DockerContainer.start(self)
        wait = LogMessageWaitStrategy(self.wait_for)
        wait.with_startup_timeout(timeout)
        wait.wait_until_ready(self)
        return self

    def get_container_host_ip(self) -> str:
        return LOCALHOST

    def get_bootstrap_server(self) -> str:
        return f"{LOCALHOST}:{self.port}"


class HostRedisContainer(RedisContainer):
    """The module's Redis container on hotswap/redis, on the host's network, append-only as the
    embedded Redis (a restart keeps the control plane)."""

    def __init__(self, image: str, port: int) -> None:
        super().__init__(image=image, port=port)
        self.ports = {}
        self.with_kwargs(network_mode="host")
        persistence = ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--dir", "/data"]
        self.with_command(["redis-server", "--port", str(port), "--bind", LOCALHOST, *persistence])

    def get_container_host_ip(self) -> str:
        return LOCALHOST

    def _get_exposed_port(self, port: int) -> int:
        return port  # the host's network: the container's port is the host's


class ContainerServices:
    """Kafka and Redis in containers for one test session; `restart` stops one and starts it again."""

    def __init__(self, kafka: HostKafkaContainer, rds: HostRedisContainer) -> None:
        self.kafka = kafka
        self.redis = rds

    @property
    def bootstrap(self) -> str:
        return self.kafka.get_bootstrap_server()

    @property
    def redis_url(self) -> str:
        return f"redis://{LOCALHOST}:{self.redis.port}/0"

    def restart(self, name: str) -> None:
        """SIGTERM the service's container (its files stay), start it again, and wait until it answers."""
        container = {"kafka": self.kafka, "redis": self.redis}[name].get_wrapped_container()
        container.restart(timeout=30)
        answers = self._kafka_answers if name == "kafka" else self._redis_answers
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers():
            if time.monotonic() >= deadline:
                raise AssertionError(f"{name} did not answer within {START_TIMEOUT_S}s of its container's restart")
            time.sleep(0.5)

    def outage(self, seconds: float) -> None:
        """SIGKILL both containers (their files stay), keep them down `seconds`, start them again
        and wait until both answer."""
        began = time.monotonic()
        containers = [c.get_wrapped_container() for c in (self.kafka, self.redis)]
        for container in containers:
            container.kill()
        time.sleep(max(0.0, seconds - (time.monotonic() - began)))  # the outage itself: nothing to poll for
        for container in containers:
            container.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self._kafka_answers() and self._redis_answers()):
            if time.monotonic() >= deadline:
                raise AssertionError(f"Kafka and Redis did not answer within {START_TIMEOUT_S}s of their restart")
            time.sleep(0.5)

    def _kafka_answers(self) -> bool:
        return kafka_answers({"bootstrap_servers": [self.bootstrap]})

    def _redis_answers(self) -> bool:
        return redis_answers(self.redis_url)


@contextmanager
def container_services(kafka_port: int, controller_port: int, redis_port: int) -> Iterator[ContainerServices]:
    """Start Kafka and Redis from hotswap's images; remove both containers on exit."""
    # Ryuk, the module's reaper of leftover containers, is an image from a registry. The containers
    # are removed on exit instead, and a leftover of a killed session is removed before starting.
    testcontainers_config.ryuk_disabled = True
    for name in ("hotswap-test-kafka", "hotswap-test-redis"):
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60, check=False)
    with ExitStack() as stack:
        kafka = HostKafkaContainer(kafka_image(), kafka_port, controller_port).with_name("hotswap-test-kafka")
        rds = HostRedisContainer(redis_image(), redis_port).with_name("hotswap-test-redis")
        stack.enter_context(rds)
        stack.callback(kafka.stop)  # also after a start that timed out
        kafka.start()
        yield ContainerServices(kafka, rds)
