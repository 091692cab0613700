"""The embedded stack: a single-node KRaft Kafka broker and a Redis server, run as plain processes.

`hotswap stack up|down|status`, the tests and the demo use it. Everything it writes lives under
`settings.home`: the fetched jars (`jars/`), the broker's config, data and log (`kafka/`), Redis's
append-only file and log (`redis/`), and `stack.json`, the pids of the processes it started.

Services named in settings (`kafka_bootstrap`, `redis_url`) are external: the stack never starts
or stops them, it only reports whether they answer. A healthy service already listening on one of
the embedded ports (say, a stack started by another checkout) is used as it is, never duplicated.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import redis
import structlog
from kafka import KafkaAdminClient  # type: ignore[import-untyped,unused-ignore]
from kafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from contract.settings import Settings
from executor.errors import StackError

log = structlog.get_logger(__name__)

COMPOSE_DIR = Path(__file__).resolve().parent.parent / "compose"
KAFKA_POM_DIR = COMPOSE_DIR / "kafka"
KAFKA_LOG4J_CONFIG = KAFKA_POM_DIR / "log4j2.yaml"
CONNECTOR_POM_DIR = COMPOSE_DIR / "spark-connector"
# Sends the GCS mirror that Spark's parent POM lists to Maven Central (see the file).
MAVEN_SETTINGS = COMPOSE_DIR / "maven-settings.xml"
# The jars Spark's Kafka source and sink need beyond what the pyspark wheel ships, in this order.
CONNECTOR_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)
KAFKA_FALLBACK_VERSION = "4.1.1"
COMPLETE_MARKER = ".complete"
LOCALHOST = "127.0.0.1"
MAVEN_TIMEOUT_S = 900.0
FORMAT_TIMEOUT_S = 120.0
STOP_GRACE_S = {"kafka": 30.0, "redis": 10.0}
KILL_WAIT_S = 5.0
POLL_S = 0.25
RACE_GRACE_S = 10.0
LOG_ROTATE_BYTES = 8 * 1024 * 1024
_START_BANNER = "--- hotswap: starting"
_JAVA_EXCEPTION = re.compile(r"^(?:[\w$]+\.)*[\w$]*(?:Exception|Error): ")
_LISTEN, _INODE = "0A", 9  # in /proc/net/tcp: the LISTEN state, the inode column
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
# Runs a command in the background with its output appended to a log, and prints its pid. The
# shell exits at once, so the service is nobody's child here: no zombies, no Popen to keep alive.
_SPAWN_SCRIPT = 'log="$1"; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'


@dataclass(frozen=True)
class ServiceStatus:
    """One service of the stack as seen right now."""

    name: str  # "kafka" or "redis"
    address: str  # "127.0.0.1:9092" / "redis://127.0.0.1:6379/0", passwords masked
    managed: bool  # True if the embedded stack runs it (its pid is in our state file)
    pid: int | None
    healthy: bool


@dataclass(frozen=True)
class _Proc:
    """A process the stack started: its pid, its start time (to survive pid reuse) and strings
    its command line must contain before we signal it."""

    pid: int
    start_ticks: int
    markers: tuple[str, ...]
    log: str

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "markers": list(self.markers), "log": self.log}

    @classmethod
    def from_json(cls, raw: Any) -> _Proc | None:
        if not isinstance(raw, dict):
            return None
        pid, start, markers, logfile = raw.get("pid"), raw.get("start_ticks"), raw.get("markers"), raw.get("log")
        if not (isinstance(pid, int) and isinstance(start, int) and isinstance(markers, list)):
            return None
        if not all(isinstance(m, str) for m in markers) or not markers:
            return None
        return cls(pid, start, tuple(markers), logfile if isinstance(logfile, str) else "")


class EmbeddedStack:
    """Fetches, starts, checks and stops the embedded Kafka broker and Redis server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.home.expanduser().resolve()
        self.kafka_dir = self.home / "kafka"
        self.redis_dir = self.home / "redis"
        self.state_file = self.home / "stack.json"

    # ------------------------------------------------------------------ jars

    def kafka_jars(self) -> Path:
        """The directory of the broker's jars, fetched from Maven Central on first use."""
        dest = self.settings.jar_cache / f"kafka-{_kafka_version()}"
        self._fetch(KAFKA_POM_DIR, dest, [], "Kafka broker")
        return dest

    def spark_connector_jars(self) -> list[Path]:
        """The paths of Spark's Kafka connector jars at the pyspark version, fetched on first use."""
        spark_version = _pyspark_version()
        dest = self.settings.jar_cache / f"spark-connector-{spark_version}"
        extra = [f"-Dspark.version={spark_version}", "-DincludeArtifactIds=" + ",".join(CONNECTOR_ARTIFACTS)]
        self._fetch(CONNECTOR_POM_DIR, dest, extra, "Spark Kafka connector")
        jars: list[Path] = []
        for artifact in CONNECTOR_ARTIFACTS:
            # "kafka-clients-3.9.1.jar", not "kafka-clients-test-...": a digit follows the artifact id.
            found = sorted(p for p in dest.glob(f"{artifact}-[0-9]*.jar"))
            if not found:
                raise StackError(
                    f"{artifact} is missing from {dest}; delete that directory and retry to fetch it again"
                )
            jars.append(found[-1])
        return jars

    def _fetch(self, pom_dir: Path, dest: Path, extra_args: list[str], what: str) -> None:
        if (dest / COMPLETE_MARKER).is_file():
            return
        if not (pom_dir / "pom.xml").is_file():
            raise StackError(f"{pom_dir / 'pom.xml'} is missing; run hotswap from a complete checkout")
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError("Maven (mvn) is not on PATH; install the Debian package maven (`make` does it)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _locked(dest.parent / f".{dest.name}.lock"):
            if (dest / COMPLETE_MARKER).is_file():  # fetched by someone else while we waited
                return
            tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            command = [
                mvn,
                "-q",
                "-B",
                "-gs",
                str(MAVEN_SETTINGS),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={tmp}",
                "-DincludeScope=runtime",
                *extra_args,
            ]
            log.info("stack.jars.fetching", what=what, dest=str(dest))
            started = time.monotonic()
            try:
                result = subprocess.run(
                    command, cwd=pom_dir, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise StackError(
                    f"fetching the {what} jars with Maven took over {MAVEN_TIMEOUT_S:.0f}s; "
                    "check access to Maven Central and retry"
                ) from exc
            jars = sorted(p.name for p in tmp.glob("*.jar"))
            if result.returncode != 0 or not jars:
                shutil.rmtree(tmp, ignore_errors=True)
                detail = _last_line(result.stdout + "\n" + result.stderr) or f"exit code {result.returncode}"
                raise StackError(
                    f"fetching the {what} jars with Maven failed ({detail}); check access to Maven Central and retry"
                )
            (tmp / COMPLETE_MARKER).write_text("\n".join(jars) + "\n")
            shutil.rmtree(dest, ignore_errors=True)  # an incomplete leftover
            os.replace(tmp, dest)
            log.info("stack.jars.fetched", what=what, jars=len(jars), seconds=round(time.monotonic() - started, 1))

    # ------------------------------------------------------------------ lifecycle

    def up(self, timeout_s: float = 120.0) -> list[ServiceStatus]:
        """Start what is neither external nor already running, then wait until both services answer."""
        self.home.mkdir(parents=True, exist_ok=True)
        with _locked(self.home / "stack.lock"):
            state = self._live_state()
            self._write_state(state)  # drops entries of processes that are gone
            start_kafka = self.settings.kafka_bootstrap is None and "kafka" not in state
            start_redis = self.settings.redis_url is None and "redis" not in state
            # Something already on the port: use it if it answers (checked below), never start a duplicate.
            foreign: set[str] = set()
            if start_kafka and _port_open(self.settings.kafka_port):
                start_kafka = False
                foreign.add("kafka")
            if start_redis and _port_open(self.settings.redis_port):
                start_redis = False
                foreign.add("redis")
            redis_server = shutil.which("redis-server") if start_redis else None
            if start_redis and redis_server is None:
                raise StackError(
                    "redis-server is not on PATH; install the Debian package redis-server (`make` does it)"
                )
            jars: Path | None = None
            if start_kafka:
                if shutil.which("java") is None:
                    raise StackError("java is not on PATH; install a Java 17 runtime (`make` does it)")
                jars = self.kafka_jars()  # may take minutes the first time: before the deadline starts

            began = time.monotonic()
            deadline = began + timeout_s
            if redis_server is not None:
                state["redis"] = self._start_redis(redis_server)
                self._write_state(state)
            if jars is not None:
                state["kafka"] = self._start_kafka(jars)
                self._write_state(state)

            self._wait_until_answering(state, foreign, deadline, timeout_s)
            log.info(
                "stack.up",
                seconds=round(time.monotonic() - began, 1),
                started=[n for n, s in (("kafka", start_kafka), ("redis", start_redis)) if s],
            )
            return [
                ServiceStatus("kafka", self._kafka_address(), *self._managed(state, "kafka"), True),
                ServiceStatus("redis", self._redis_address(), *self._managed(state, "redis"), True),
            ]

    def _external(self, name: str) -> bool:
        return (self.settings.kafka_bootstrap if name == "kafka" else self.settings.redis_url) is not None

    def _managed(self, state: dict[str, _Proc], name: str) -> tuple[bool, int | None]:
        """(managed, pid): ours if our state file has its live pid and settings do not name an external one."""
        proc = None if self._external(name) else state.get(name)
        return (proc is not None, proc.pid if proc is not None else None)

    def _wait_until_answering(
        self, state: dict[str, _Proc], foreign: set[str], deadline: float, timeout_s: float
    ) -> None:
        """Poll both services until they answer; fail early if one we started exits."""
        waiting: dict[str, Callable[[], bool]] = {"kafka": self._kafka_answers, "redis": self._redis_answers}
        while True:
            for name in list(waiting):
                proc = None if self._external(name) else state.get(name)
                if proc is not None and not _is_ours(proc):
                    del state[name]
                    self._write_state(state)
                    if self._taken_meanwhile(name, waiting[name], deadline):
                        log.info("stack.port_taken_meanwhile", service=name)
                        foreign.add(name)
                        del waiting[name]
                        continue
                    hint = _failure_hint(proc.log)
                    raise StackError(
                        f"{_title(name)} exited while starting{f' ({hint})' if hint else ''}; "
                        f"see {proc.log}, fix it and run up again"
                    )
                # A process we started counts once it answers *and* holds the port itself (not a
                # stack of another checkout that won a race for it while ours is failing to bind).
                port = self.settings.kafka_port if name == "kafka" else self.settings.redis_port
                if waiting[name]() and (proc is None or _listens(proc.pid, port)):
                    del waiting[name]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise StackError(self._not_up_message(sorted(waiting), state, foreign, timeout_s))
            time.sleep(POLL_S)

    def _taken_meanwhile(self, name: str, answers: Callable[[], bool], deadline: float) -> bool:
        """After one of ours died: did another stack (say, of another checkout started at the same
        time) take its ports? If they are in use, give that one a little while to answer."""
        if name == "kafka":
            ports = [self.settings.kafka_port, self.settings.kafka_controller_port]
        else:
            ports = [self.settings.redis_port]
        if not any(_port_open(port) for port in ports):
            return False
        until = min(deadline, time.monotonic() + RACE_GRACE_S)
        while not answers():
            if time.monotonic() >= until:
                return False
            time.sleep(POLL_S)
        return True

    def down(self) -> list[str]:
        """Stop the processes this stack started (SIGTERM, wait, SIGKILL); return the names stopped."""
        if not self.home.is_dir():
            return []
        stopped: list[str] = []
        with _locked(self.home / "stack.lock"):
            state = self._read_state()
            for name in ("kafka", "redis"):
                proc = state.get(name)
                if proc is None:
                    continue
                if _is_ours(proc):
                    log.info("stack.stopping", service=name, pid=proc.pid)
                    _terminate(proc, STOP_GRACE_S[name])
                    stopped.append(name)
                else:
                    log.info("stack.stale_entry", service=name, pid=proc.pid)
                del state[name]
                self._write_state(state)
        return stopped

    def status(self) -> list[ServiceStatus]:
        """Both services: where they are, whether we run them, and whether they answer now."""
        state = self._live_state()
        return [
            ServiceStatus("kafka", self._kafka_address(), *self._managed(state, "kafka"), self._kafka_answers()),
            ServiceStatus("redis", self._redis_address(), *self._managed(state, "redis"), self._redis_answers()),
        ]

    # ------------------------------------------------------------------ kafka

    def _kafka_address(self) -> str:
        return self.settings.kafka_bootstrap or f"{LOCALHOST}:{self.settings.kafka_port}"

    def _kafka_answers(self) -> bool:
        if self.settings.kafka_bootstrap is None:
            if not _port_open(self.settings.kafka_port):
                return False
            config: dict[str, Any] = {"bootstrap_servers": [f"{LOCALHOST}:{self.settings.kafka_port}"]}
        else:
            config = self.settings.kafka_python_config()
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

    def _server_properties(self) -> str:
        port, controller = self.settings.kafka_port, self.settings.kafka_controller_port
        listeners = f"PLAINTEXT://{LOCALHOST}:{port},CONTROLLER://{LOCALHOST}:{controller}"
        props = {
            # Single node, KRaft: this process is both the broker and the (only) controller.
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{LOCALHOST}:{controller}",
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.kafka_dir / "data"),
            # One replica of everything; few partitions for internal topics too.
            "num.partitions": "2",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            # Lean on a small shared machine: few threads, a small cleaner buffer for a small heap.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "num.replica.fetchers": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            # Keep the disk small: a day or 256 MiB per partition, in 16 MiB segments.
            "log.retention.hours": "24",
            "log.retention.bytes": str(256 * 1024 * 1024),
            "log.segment.bytes": str(16 * 1024 * 1024),
            "log.retention.check.interval.ms": "60000",
        }
        lines = ["# Written by `hotswap stack up` on every start; edits are overwritten.", ""]
        lines += [f"{key}={value}" for key, value in props.items()]
        return "\n".join(lines) + "\n"

    def _java_args(self, jars: Path) -> list[str]:
        """What the broker and its storage tool share: the log4j config and the class path."""
        return [f"-Dlog4j2.configurationFile={KAFKA_LOG4J_CONFIG}", "-cp", f"{jars}/*"]

    def _start_kafka(self, jars: Path) -> _Proc:
        if not KAFKA_LOG4J_CONFIG.is_file():
            raise StackError(f"{KAFKA_LOG4J_CONFIG} is missing; run hotswap from a complete checkout")
        data = self.kafka_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        server_properties = self.kafka_dir / "server.properties"
        server_properties.write_text(self._server_properties())
        logfile = self.kafka_dir / "kafka.log"
        _rotate(logfile)
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
            *self._java_args(jars),
            "kafka.Kafka",
            str(server_properties),
        ]
        log.info("stack.kafka.starting", port=self.settings.kafka_port, log=str(logfile))
        return _spawn("kafka", command, logfile, self.kafka_dir, ("kafka.Kafka", str(server_properties)))

    def _format_storage(self, jars: Path, server_properties: Path, logfile: Path) -> None:
        command = [
            _java(),
            *self._java_args(jars),
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            _cluster_id(),
            "-c",
            str(server_properties),
        ]
        try:
            result = subprocess.run(
                command, cwd=self.kafka_dir, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"formatting Kafka's storage took over {FORMAT_TIMEOUT_S:.0f}s; retry") from exc
        with logfile.open("a") as out:
            out.write(result.stdout + result.stderr)
        if result.returncode != 0:
            detail = _last_line(result.stdout + "\n" + result.stderr) or f"exit code {result.returncode}"
            raise StackError(
                f"formatting Kafka's storage failed ({detail}); see {logfile}, or delete {self.kafka_dir / 'data'}"
            )
        log.info("stack.kafka.formatted", data=str(self.kafka_dir / "data"))

    # ------------------------------------------------------------------ redis

    def _redis_address(self) -> str:
        return _mask_url(self.settings.redis_dsn)

    def _redis_answers(self) -> bool:
        if self.settings.redis_url is None and not _port_open(self.settings.redis_port):
            return False
        client = redis.Redis.from_url(self.settings.redis_dsn, socket_timeout=2.0, socket_connect_timeout=2.0)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def _start_redis(self, redis_server: str) -> _Proc:
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        logfile = self.redis_dir / "redis.log"
        _rotate(logfile)
        port = str(self.settings.redis_port)
        command = [
            redis_server,
            "--port",
            port,
            "--bind",
            LOCALHOST,
            "--appendonly",
            "yes",
            # The control plane writes little, and a recorded cut must survive a crash of Redis too.
            "--appendfsync",
            "always",
            "--dir",
            str(self.redis_dir),
            "--daemonize",
            "no",
            "--save",
            "",
            "--pidfile",
            str(self.redis_dir / "redis.pid"),
            "--logfile",
            "",
        ]
        log.info("stack.redis.starting", port=self.settings.redis_port, log=str(logfile))
        # Redis rewrites its process title to "redis-server 127.0.0.1:<port>".
        return _spawn("redis", command, logfile, self.redis_dir, ("redis-server", port))

    # ------------------------------------------------------------------ state

    def _read_state(self) -> dict[str, _Proc]:
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("stack.state_unreadable", path=str(self.state_file), error=str(exc))
            return {}
        if not isinstance(raw, dict):
            return {}
        state: dict[str, _Proc] = {}
        for name in ("kafka", "redis"):
            proc = _Proc.from_json(raw.get(name))
            if proc is not None:
                state[name] = proc
        return state

    def _live_state(self) -> dict[str, _Proc]:
        return {name: proc for name, proc in self._read_state().items() if _is_ours(proc)}

    def _write_state(self, state: dict[str, _Proc]) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({name: proc.to_json() for name, proc in state.items()}, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    def _not_up_message(self, names: list[str], state: dict[str, _Proc], foreign: set[str], timeout_s: float) -> str:
        parts: list[str] = []
        for name in names:
            proc = None if self._external(name) else state.get(name)
            port = self.settings.kafka_port if name == "kafka" else self.settings.redis_port
            env = "HOTSWAP_KAFKA_BOOTSTRAP" if name == "kafka" else "HOTSWAP_REDIS_URL"
            address = self._kafka_address() if name == "kafka" else self._redis_address()
            if proc is not None:
                parts.append(f"{_title(name)} (pid {proc.pid}) did not answer on {address}; see {proc.log}")
            elif name in foreign:
                parts.append(
                    f"port {port} is taken by another process that does not answer as {_title(name)}; "
                    f"stop it or pick another port"
                )
            else:
                parts.append(f"external {_title(name)} at {address} ({env}) did not answer; check it is reachable")
        started = any(name in state and not self._external(name) for name in names)
        ours = " (`hotswap stack down` stops what we started)" if started else ""
        return f"stack not up after {timeout_s:.0f}s: " + "; ".join(parts) + ours


# ---------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path`, held for the block (across processes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _spawn(name: str, command: list[str], logfile: Path, cwd: Path, markers: tuple[str, ...]) -> _Proc:
    """Start `command` detached (own session, output appended to `logfile`) and describe it."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("a") as out:
        out.write(f"\n{_START_BANNER} {name} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
    try:
        result = subprocess.run(
            ["/bin/sh", "-c", _SPAWN_SCRIPT, "hotswap-spawn", str(logfile), *command],
            cwd=cwd,
            capture_output=True,
            text=True,
            start_new_session=True,
            timeout=30.0,
            check=True,
        )
        pid = int(result.stdout.strip())
    except (subprocess.SubprocessError, ValueError, OSError) as exc:
        raise StackError(f"could not start {_title(name)} ({exc}); see {logfile}") from exc
    start_ticks = _start_ticks(pid)
    if start_ticks is None:
        hint = _failure_hint(str(logfile))
        raise StackError(
            f"{_title(name)} exited at once{f' ({hint})' if hint else ''}; see {logfile}, fix it and run up again"
        )
    return _Proc(pid, start_ticks, markers, str(logfile))


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _start_ticks(pid: int) -> int | None:
    """Start time of a running (not zombie) process, None if it is gone."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return None
    return stat[1]


def _is_ours(proc: _Proc) -> bool:
    """True if `proc` still runs, is the very process we started, and its cmdline looks like ours."""
    if _start_ticks(proc.pid) != proc.start_ticks:
        return False
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return all(marker in cmdline for marker in proc.markers)


def _terminate(proc: _Proc, grace_s: float) -> None:
    """SIGTERM, wait up to `grace_s`, then SIGKILL and wait a little more."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _start_ticks(proc.pid) != proc.start_ticks:
                return
            time.sleep(0.1)
        if sig == signal.SIGTERM:
            log.warning("stack.kill", pid=proc.pid, after_s=grace_s)
    raise StackError(f"pid {proc.pid} survived SIGKILL; check it with `ps -p {proc.pid}`")


def _listens(pid: int, port: int) -> bool:
    """True if process `pid` holds a socket listening on TCP `port` (via /proc; False if unreadable)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode
            if len(fields) > _INODE and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[_INODE]}]")
    if not inodes:
        return False
    try:
        with os.scandir(f"/proc/{pid}/fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in inodes:
                        return True
    except OSError:
        return False
    return False


def _port_open(port: int, host: str = LOCALHOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _rotate(logfile: Path) -> None:
    """Keep one previous log when the current one has grown large."""
    try:
        if logfile.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(logfile, logfile.with_name(logfile.name + ".1"))
    except FileNotFoundError:
        pass


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding, not starting with '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _kafka_version() -> str:
    """The kafka_2.13 version pinned in compose/kafka/pom.xml."""
    try:
        root = ET.parse(KAFKA_POM_DIR / "pom.xml").getroot()  # noqa: S314 - our own pom, not untrusted input
    except (OSError, ET.ParseError):
        return KAFKA_FALLBACK_VERSION
    for dependency in root.iterfind("m:dependencies/m:dependency", _POM_NS):
        if dependency.findtext("m:artifactId", namespaces=_POM_NS) == "kafka_2.13":
            version = dependency.findtext("m:version", namespaces=_POM_NS)
            if version and not version.startswith("$"):
                return version.strip()
    return KAFKA_FALLBACK_VERSION


def _pyspark_version() -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError as exc:
        raise StackError("pyspark is not installed; run `make` to create the virtualenv") from exc


def _mask_url(url: str) -> str:
    """The URL with whatever sits before '@' in its authority masked (a password, or a lone token)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    credentials, host = authority.rsplit("@", 1)
    user, colon, _ = credentials.partition(":")
    masked = f"{user}:***" if colon else "***"
    return f"{scheme}://{masked}@{host}{slash}{path}"


def _failure_hint(logfile: str) -> str:
    """The line of a service's log (since our last start) most likely to say why it stopped."""
    try:
        text = Path(logfile).read_text(errors="replace")
    except OSError:
        return ""
    start = text.rfind(_START_BANNER)
    if start >= 0:
        text = text[start:].split("\n", 1)[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for index, line in enumerate(lines):  # the first Java exception is the cause; later ones wrap it
        if line.startswith("Error: Could not create the Java Virtual Machine") and index > 0:
            return lines[index - 1][:200]  # the JVM says why on the line before, e.g. a bad -Xmx
        if _JAVA_EXCEPTION.match(line):
            return line[:200]
    for line in reversed(lines):  # Redis marks warnings with '#'; the JVM's own errors start with "Error:"
        if " # " in line or line.startswith("Error:") or " ERROR " in line:
            return line[:200]
    return lines[-1][:200] if lines else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _java() -> str:
    return shutil.which("java") or "java"


def _title(name: str) -> str:
    return {"kafka": "Kafka", "redis": "Redis"}.get(name, name)
