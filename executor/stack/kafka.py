"""The embedded Kafka broker: one JVM that is both broker and KRaft controller, under `<home>/kafka/`."""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import structlog
from kafka import KafkaAdminClient  # type: ignore[import-untyped,unused-ignore]
from kafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from contract.settings import Settings
from executor.errors import StackError
from executor.stack.jars import KAFKA_POM_DIR
from executor.stack.process import LOCALHOST, Proc, last_line, port_open, rotate, spawn
from executor.stack.service import Service

log = structlog.get_logger(__name__)

KAFKA_LOG4J_CONFIG = KAFKA_POM_DIR / "log4j2.yaml"
FORMAT_TIMEOUT_S = 120.0


class KafkaBroker(Service):
    """The embedded broker, or the external brokers that settings name (then only `answers` is used)."""

    name = "kafka"
    title = "Kafka"
    env = "HOTSWAP_KAFKA_BOOTSTRAP"
    stop_grace_s = 30.0  # a broker flushes and closes its logs on SIGTERM

    def __init__(self, settings: Settings, home: Path) -> None:
        super().__init__(
            settings,
            home,
            external=settings.kafka_bootstrap is not None,
            ports=(settings.kafka_port, settings.kafka_controller_port),
        )

    def address(self) -> str:
        return self.settings.kafka_bootstrap or f"{LOCALHOST}:{self.port}"

    def answers(self) -> bool:
        """True if the broker lists its topics within a couple of seconds."""
        if self.external:
            config = self.settings.kafka_python_config()
        else:
            if not port_open(self.port):  # cheap, and spares kafka-python's retries on a closed port
                return False
            config = {"bootstrap_servers": [f"{LOCALHOST}:{self.port}"]}
        try:
            admin = KafkaAdminClient(
                **config, client_id="hotswap-stack-probe", bootstrap_timeout_ms=2000, request_timeout_ms=2000
            )
        except (KafkaError, OSError):
            return False
        try:
            admin.list_topics()
        except (KafkaError, OSError):
            return False
        finally:
            admin.close()
        return True

    def server_properties(self) -> str:
        """The broker's config file, written on every start."""
        controller = self.settings.kafka_controller_port
        listeners = f"PLAINTEXT://{LOCALHOST}:{self.port},CONTROLLER://{LOCALHOST}:{controller}"
        props: dict[str, Any] = {
            # Single node, KRaft: this process is both the broker and the (only) controller.
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.bootstrap.servers": f"{LOCALHOST}:{controller}",
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": self.dir / "data",
            # One replica of everything; few partitions for internal topics too.
            "num.partitions": 2,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "share.coordinator.state.topic.num.partitions": 4,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            # Lean on a small shared machine: few threads, a small cleaner buffer for a small heap.
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "num.replica.fetchers": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            # Keep the disk small: a day or 256 MiB per partition, in 16 MiB segments.
            "log.retention.hours": 24,
            "log.retention.bytes": 256 * 1024 * 1024,
            "log.segment.bytes": 16 * 1024 * 1024,
            "log.retention.check.interval.ms": 60000,
        }
        lines = ["# Written by `hotswap stack up` on every start; edits are overwritten.", ""]
        lines += [f"{key}={value}" for key, value in props.items()]
        return "\n".join(lines) + "\n"

    def start(self, jars: Path) -> Proc:
        """Write the config, format the storage on first start, and start the broker detached."""
        if not KAFKA_LOG4J_CONFIG.is_file():
            raise StackError(f"{KAFKA_LOG4J_CONFIG} is missing; run hotswap from a complete checkout")
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        server_properties = self.dir / "server.properties"
        server_properties.write_text(self.server_properties())
        logfile = self.dir / "kafka.log"
        rotate(logfile)
        if not (data / "meta.properties").is_file():
            self._format_storage(jars, server_properties, logfile)
        heap = self.settings.kafka_heap
        command = [
            _java(),
            f"-Xmx{heap}",
            f"-Xms{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            *_java_args(jars),
            "kafka.Kafka",
            str(server_properties),
        ]
        log.info("stack.kafka.starting", port=self.port, log=str(logfile))
        return spawn(self.title, command, logfile, self.dir, ("kafka.Kafka", str(server_properties)))

    def _format_storage(self, jars: Path, server_properties: Path, logfile: Path) -> None:
        command = [
            _java(),
            *_java_args(jars),
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            cluster_id(),
            "-c",
            str(server_properties),
        ]
        try:
            result = subprocess.run(
                command, cwd=self.dir, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"formatting Kafka's storage took over {FORMAT_TIMEOUT_S:.0f}s; retry") from exc
        with logfile.open("a") as out:
            out.write(result.stdout + result.stderr)
        if result.returncode != 0:
            detail = last_line(result.stdout + "\n" + result.stderr) or f"exit code {result.returncode}"
            raise StackError(
                f"formatting Kafka's storage failed ({detail}); see {logfile}, or delete {self.dir / 'data'}"
            )
        log.info("stack.kafka.formatted", data=str(self.dir / "data"))


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding, not starting with '-'."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not candidate.startswith("-"):  # the storage tool would read it as an option
            return candidate


def _java_args(jars: Path) -> list[str]:
    """What the broker and its storage tool share: the log4j config and the class path."""
    return [f"-Dlog4j2.configurationFile={KAFKA_LOG4J_CONFIG}", "-cp", f"{jars}/*"]


def _java() -> str:
    return shutil.which("java") or "java"
