"""The embedded Kafka: one JVM that is both broker and KRaft controller under `<home>/kafka/`, or, with
`kafka_brokers` > 1, a cluster of such JVMs under `<home>/kafka-cluster/node-<id>/` sharing one
cluster id and one static controller quorum."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import structlog
from kafka import KafkaAdminClient  # type: ignore[import-untyped,unused-ignore]
from kafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from hotswap.contract.settings import KafkaSettings, StackSettings
from hotswap.executor.errors import StackError
from hotswap.executor.stack.jars import KAFKA_POM_DIR
from hotswap.executor.stack.process import LOCALHOST, Proc, last_line, port_open, rotate, spawn
from hotswap.executor.stack.service import Service

log = structlog.get_logger(__name__)

KAFKA_LOG4J_CONFIG = KAFKA_POM_DIR / "log4j2.yaml"
FORMAT_TIMEOUT_S = 120.0
CLUSTER_DIR = "kafka-cluster"
CLUSTER_FILE = "cluster.json"
# Internal topics never ask for more replicas than this, however many brokers run.
MAX_INTERNAL_REPLICAS = 3


def kafka_answers(config: dict[str, Any]) -> bool:
    """True if the Kafka that `config` (kafka-python's) points at lists its topics within a couple of seconds."""
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


class KafkaBroker(Service):
    """One embedded broker (node `node` of `stack.kafka_brokers`), or the external brokers that
    settings name (then only `answers` is used)."""

    title = "Kafka"
    env = "HOTSWAP_KAFKA_BOOTSTRAP"
    stop_grace_s = 30.0  # a broker flushes and closes its logs on SIGTERM

    def __init__(self, stack: StackSettings, kafka: KafkaSettings, home: Path, node: int = 1) -> None:
        self.node = node
        self._kafka = kafka  # how a client reaches the brokers (external ones, or the cluster once up)
        self.clustered = stack.kafka_brokers > 1 and stack.kafka_bootstrap is None
        # The single broker keeps the name and directory it always had; a cluster's nodes are numbered.
        self.name = f"kafka-{node}" if self.clustered else "kafka"
        if self.clustered:
            self.title = f"Kafka node {node}"
        super().__init__(
            stack,
            home,
            external=stack.kafka_bootstrap is not None,
            ports=(stack.kafka_port + node - 1, stack.kafka_controller_port + node - 1),
        )
        if self.clustered:
            self.dir = home / CLUSTER_DIR / f"node-{node}"

    def address(self) -> str:
        return self.stack.kafka_bootstrap or f"{LOCALHOST}:{self.port}"

    def answers(self) -> bool:
        """True if the broker lists its topics within a couple of seconds."""
        if self.external:
            config = self._kafka.kafka_python_config()
        else:
            if not port_open(self.port):  # cheap, and spares kafka-python's retries on a closed port
                return False
            config = {"bootstrap_servers": [f"{LOCALHOST}:{self.port}"]}
        return kafka_answers(config)

    def registered_nodes(self) -> set[int]:
        """The node ids of the brokers the cluster lists as registered and unfenced now (empty if it
        cannot be asked)."""
        try:
            admin = KafkaAdminClient(
                **self._kafka.kafka_python_config(),
                client_id="hotswap-stack-probe",
                bootstrap_timeout_ms=2000,
                request_timeout_ms=2000,
            )
        except (KafkaError, OSError):
            return set()
        try:
            cluster = admin.describe_cluster()
        except (KafkaError, OSError):
            return set()
        finally:
            admin.close()
        return {int(b["broker_id"]) for b in cluster.get("brokers", []) if not b.get("is_fenced", False)}

    def server_properties(self) -> str:
        """The broker's config file, written on every start."""
        controller = self.ports[1]
        listeners = f"PLAINTEXT://{LOCALHOST}:{self.port},CONTROLLER://{LOCALHOST}:{controller}"
        # Internal topics get as many replicas as there are brokers (up to 3) and tolerate one loss.
        replicas = min(self.stack.kafka_brokers, MAX_INTERNAL_REPLICAS) if self.clustered else 1
        internal_isr = max(1, replicas - 1)
        if self.clustered:
            # Every node is broker and controller; the voters are fixed (a static quorum), so the storage
            # is formatted without --standalone and every node lists them all.
            voters = ",".join(
                f"{node}@{LOCALHOST}:{port}" for node, port in enumerate(self.stack.embedded_controller_ports, 1)
            )
            quorum: dict[str, Any] = {"controller.quorum.voters": voters}
        else:
            quorum = {"controller.quorum.bootstrap.servers": f"{LOCALHOST}:{controller}"}
        props: dict[str, Any] = {
            # KRaft: this process is both a broker and a controller (the only one, unless clustered).
            "process.roles": "broker,controller",
            "node.id": self.node,
            **quorum,
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": self.dir / "data",
            # Few partitions for internal topics too. min.insync.replicas stays Kafka's default of 1:
            # hotswap sets it on its own topics (topic_min_insync_replicas).
            "num.partitions": 2,
            "default.replication.factor": replicas,
            "min.insync.replicas": 1,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": internal_isr,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": internal_isr,
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

    def start(self, jars: Path, cluster: str) -> Proc:
        """Write the config, format the storage on first start (as part of the cluster with id
        `cluster`), and start the broker detached."""
        if not KAFKA_LOG4J_CONFIG.is_file():
            raise StackError(f"{KAFKA_LOG4J_CONFIG} is missing; run hotswap from a complete checkout")
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        server_properties = self.dir / "server.properties"
        server_properties.write_text(self.server_properties())
        logfile = self.dir / "kafka.log"
        rotate(logfile)
        if not (data / "meta.properties").is_file():
            self._format_storage(jars, server_properties, logfile, cluster)
        heap = self.stack.kafka_heap
        command = [
            _java(),
            f"-Xmx{heap}",
            f"-Xms{heap}",
            # Its whole heap touched at start: its memory is then what it holds from the first minute, not
            # growing as G1 first uses each region (the bench's flat-memory check read that as growth).
            "-XX:+AlwaysPreTouch",
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
        log.info("stack.kafka.starting", node=self.node, port=self.port, log=str(logfile))
        return spawn(self.title, command, logfile, self.dir, ("kafka.Kafka", str(server_properties)))

    def _format_storage(self, jars: Path, server_properties: Path, logfile: Path, cluster: str) -> None:
        # --standalone goes with controller.quorum.bootstrap.servers; a static quorum formats without it.
        standalone = [] if self.clustered else ["--standalone"]
        command = [
            _java(),
            *_java_args(jars),
            "kafka.tools.StorageTool",
            "format",
            *standalone,
            "-t",
            cluster,
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
        log.info("stack.kafka.formatted", node=self.node, data=str(self.dir / "data"))


def cluster_of(stack: StackSettings, home: Path) -> str:
    """The cluster id the embedded brokers' storage is formatted with. A single broker gets a new one
    (it is formatted once, alone). A cluster's id and size are kept in `<home>/kafka-cluster/cluster.json`,
    so a node formatted later joins the same cluster, and a cluster is never restarted at another size
    (its static quorum is written into every node's storage)."""
    if stack.kafka_brokers == 1:
        return cluster_id()
    directory = home / CLUSTER_DIR
    path = directory / CLUSTER_FILE
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        recorded = None
    except (OSError, ValueError) as exc:
        raise StackError(f"{path} is unreadable ({exc}); delete {directory} to start the cluster afresh") from exc
    if recorded is None:
        directory.mkdir(parents=True, exist_ok=True)
        recorded = {"cluster_id": cluster_id(), "brokers": stack.kafka_brokers}
        path.write_text(json.dumps(recorded) + "\n")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("cluster_id"), str):
        raise StackError(f"{path} does not name a cluster id; delete {directory} to start the cluster afresh")
    if recorded.get("brokers") != stack.kafka_brokers:
        raise StackError(
            f"the embedded Kafka cluster in {directory} has {recorded.get('brokers')} brokers, not "
            f"{stack.kafka_brokers}; set HOTSWAP_KAFKA_BROKERS={recorded.get('brokers')}, or stop it and delete "
            f"{directory} to start one of {stack.kafka_brokers}"
        )
    return str(recorded["cluster_id"])


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
