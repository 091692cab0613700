"""EmbeddedStack: `hotswap stack up | down | status | fetch` over the broker and Redis (see the package docstring)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from hotswap.contract.settings import KafkaSettings, StackSettings
from hotswap.executor.errors import StackError
from hotswap.executor.stack import jars
from hotswap.executor.stack.kafka import KafkaBroker, cluster_of
from hotswap.executor.stack.postgres import PostgresServer
from hotswap.executor.stack.process import (
    Proc,
    ProcessState,
    failure_hint,
    is_ours,
    listens,
    port_open,
    terminate_all,
)
from hotswap.executor.stack.redis import RedisServer
from hotswap.executor.stack.service import Service

log = structlog.get_logger(__name__)

POLL_S = 0.25
# How long a service that took our port while ours failed to start gets to answer (see _taken_meanwhile).
RACE_GRACE_S = 10.0


@dataclass(frozen=True)
class ServiceStatus:
    """One service of the stack as seen right now."""

    name: str  # "kafka" (or "kafka-1", "kafka-2", ... for a cluster's nodes) or "redis"
    address: str  # "127.0.0.1:9092" / "redis://127.0.0.1:6379/0", passwords masked
    managed: bool  # True if the embedded stack runs it (its pid is in our state file)
    pid: int | None
    healthy: bool


class EmbeddedStack:
    """Fetches, starts, checks and stops the embedded Kafka broker (or brokers) and Redis server."""

    def __init__(self, stack: StackSettings, kafka: KafkaSettings) -> None:
        self.settings = stack
        self.home = stack.home.expanduser().resolve()
        # External brokers are one service: the stack only asks whether they answer.
        nodes = 1 if stack.kafka_bootstrap is not None else stack.kafka_brokers
        self.brokers = tuple(KafkaBroker(stack, kafka, self.home, node) for node in range(1, nodes + 1))
        self.kafka = self.brokers[0]
        self.redis = RedisServer(stack, self.home)
        self.postgres = PostgresServer(stack, self.home)
        asked = (self.postgres,) if stack.stack_postgres else ()
        self.services: tuple[Service, ...] = (*self.brokers, self.redis, *asked)
        self.state = ProcessState(self.home)

    # ------------------------------------------------------------------ jars

    def kafka_jars(self) -> Path:
        """The directory of the broker's jars, fetched from Maven Central on first use."""
        return jars.kafka_jars(self.settings.jar_cache)

    def spark_connector_jars(self) -> list[Path]:
        """The paths of Spark's Kafka connector jars at the pyspark version, fetched on first use."""
        return jars.fetch_connector_jars(self.settings.jar_cache)

    # ------------------------------------------------------------------ lifecycle

    def up(self, timeout_s: float = 120.0) -> list[ServiceStatus]:
        """Start what is neither external nor already running, then wait until both services answer."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self.state.lock():
            state = self.state.live()
            self.state.write(state)  # drops entries of processes that are gone
            to_start: list[str] = []
            # Something already on the port: use it if it answers (checked below), never start a duplicate.
            foreign: set[str] = set()
            for service in self.services:
                if service.external or service.name in state:
                    continue
                if port_open(service.port):
                    foreign.add(service.name)
                else:
                    to_start.append(service.name)
            redis_server = shutil.which("redis-server") if "redis" in to_start else None
            if "redis" in to_start and redis_server is None:
                raise StackError(
                    "redis-server is not on PATH; install the Debian package redis-server (`make` does it)"
                )
            brokers = [broker for broker in self.brokers if broker.name in to_start]
            kafka_jars: Path | None = None
            if brokers:
                if shutil.which("java") is None:
                    raise StackError("java is not on PATH; install a Java 17 runtime (`make` does it)")
                kafka_jars = self.kafka_jars()  # may take minutes the first time: before the deadline starts

            began = time.monotonic()
            if redis_server is not None:
                state["redis"] = self.redis.start(redis_server)
                self.state.write(state)
            if "postgres" in to_start:
                state["postgres"] = self.postgres.start()
                self.state.write(state)
            if kafka_jars is not None:
                cluster = cluster_of(self.settings, self.home)
                for broker in brokers:
                    state[broker.name] = broker.start(kafka_jars, cluster)
                    self.state.write(state)

            self._wait_until_answering(state, foreign, began + timeout_s, timeout_s)
            if len(self.brokers) > 1:
                self._wait_for_every_broker(began + timeout_s, timeout_s)
            log.info("stack.up", seconds=round(time.monotonic() - began, 1), started=to_start)
            return [self._status(service, state, healthy=True) for service in self.services]

    def down(self) -> list[str]:
        """Stop the processes this stack started (SIGTERM, wait, SIGKILL); return the names stopped.
        Every process in the state file is stopped, whatever the settings now say (a cluster of
        another size, say): the file, not the settings, knows what was started."""
        if not self.home.is_dir():
            return []
        stopped: list[str] = []
        with self.state.lock():
            state = self.state.read()
            for name, proc in list(state.items()):
                if not is_ours(proc):
                    log.info("stack.stale_entry", service=name, pid=proc.pid)
                    del state[name]
            self.state.write(state)
            brokers = sorted(name for name in state if name.startswith("kafka"))
            # Brokers first and together (see terminate_all), then Redis, then PostgreSQL.
            groups = (
                (brokers, self.kafka.stop_grace_s),
                (["redis"], self.redis.stop_grace_s),
                (["postgres"], self.postgres.stop_grace_s),
            )
            for group, grace_s in groups:
                procs = [state[name] for name in group if name in state]
                if not procs:
                    continue
                for name in group:
                    if name in state:
                        log.info("stack.stopping", service=name, pid=state[name].pid)
                terminate_all(procs, grace_s)
                for name in group:
                    if state.pop(name, None) is not None:
                        stopped.append(name)
                self.state.write(state)
        return stopped

    def status(self) -> list[ServiceStatus]:
        """Both services: where they are, whether we run them, and whether they answer now."""
        state = self.state.live()
        # PostgreSQL is shown whenever this stack runs it, asked for now or not.
        started = (self.postgres,) if "postgres" in state and self.postgres not in self.services else ()
        return [self._status(service, state, healthy=service.answers()) for service in (*self.services, *started)]

    # ------------------------------------------------------------------ helpers

    def _ours(self, state: dict[str, Proc], service: Service) -> Proc | None:
        """The process we started for `service`, unless settings now name an external one."""
        return None if service.external else state.get(service.name)

    def _status(self, service: Service, state: dict[str, Proc], healthy: bool) -> ServiceStatus:
        proc = self._ours(state, service)
        pid = proc.pid if proc is not None else None
        return ServiceStatus(service.name, service.address(), proc is not None, pid, healthy)

    def _wait_until_answering(
        self, state: dict[str, Proc], foreign: set[str], deadline: float, timeout_s: float
    ) -> None:
        """Poll both services until they answer; fail early if one we started exits."""
        waiting = {service.name: service for service in self.services}
        while True:
            for name, service in list(waiting.items()):
                proc = self._ours(state, service)
                if proc is not None and not is_ours(proc):
                    del state[name]
                    self.state.write(state)
                    if self._taken_meanwhile(service, deadline):
                        log.info("stack.port_taken_meanwhile", service=name)
                        foreign.add(name)
                        del waiting[name]
                        continue
                    hint = failure_hint(proc.log)
                    raise StackError(
                        f"{service.title} exited while starting{f' ({hint})' if hint else ''}; "
                        f"see {proc.log}, fix it and run up again"
                    )
                # A process we started counts once it answers *and* holds the port itself (not a
                # stack of another checkout that won a race for it while ours is failing to bind).
                if service.answers() and (proc is None or listens(proc.pid, service.port)):
                    del waiting[name]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise StackError(self._not_up_message(list(waiting.values()), state, foreign, timeout_s))
            time.sleep(POLL_S)

    def _wait_for_every_broker(self, deadline: float, timeout_s: float) -> None:
        """Until the cluster's metadata lists every node: a topic with as many replicas as there are
        brokers can only be created once each has registered with the controller."""
        wanted = {broker.node for broker in self.brokers}
        seen: set[int] = set()
        while True:
            seen = self.kafka.registered_nodes()
            if wanted <= seen:
                return
            if time.monotonic() >= deadline:
                missing = ", ".join(str(node) for node in sorted(wanted - seen))
                raise StackError(
                    f"stack not up after {timeout_s:.0f}s: Kafka node(s) {missing} answer but have not joined the "
                    f"cluster; see their kafka.log under {self.home}, or `hotswap stack down` and up again"
                )
            time.sleep(POLL_S)

    def _taken_meanwhile(self, service: Service, deadline: float) -> bool:
        """After one of ours died: did another stack (say, of another checkout started at the same
        time) take its ports? If they are in use, give that one a little while to answer."""
        if not any(port_open(port) for port in service.ports):
            return False
        until = min(deadline, time.monotonic() + RACE_GRACE_S)
        while not service.answers():
            if time.monotonic() >= until:
                return False
            time.sleep(POLL_S)
        return True

    def _not_up_message(
        self, services: list[Service], state: dict[str, Proc], foreign: set[str], timeout_s: float
    ) -> str:
        parts: list[str] = []
        for service in services:
            proc = self._ours(state, service)
            if proc is not None:
                parts.append(f"{service.title} (pid {proc.pid}) did not answer on {service.address()}; see {proc.log}")
            elif service.name in foreign:
                parts.append(
                    f"port {service.port} is taken by another process that does not answer as {service.title}; "
                    f"stop it or pick another port"
                )
            else:
                parts.append(
                    f"external {service.title} at {service.address()} ({service.env}) did not answer; "
                    "check it is reachable"
                )
        started = any(self._ours(state, service) is not None for service in services)
        ours = " (`hotswap stack down` stops what we started)" if started else ""
        return f"stack not up after {timeout_s:.0f}s: " + "; ".join(parts) + ours
