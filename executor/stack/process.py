"""Process supervision for the embedded stack: start a service detached, recognise it later, stop it.

A started service is remembered as a `Proc` in the state file (`<home>/stack.json`). Its pid alone
is not enough: after the service dies the kernel may hand that pid to an unrelated process, so a
`Proc` also holds when the process started and strings its command line must contain, and
nothing is signalled unless all of them still match.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import structlog

from hotswap.executor.errors import StackError

log = structlog.get_logger(__name__)

LOCALHOST = "127.0.0.1"
# The services a state file may name: the broker, a cluster's numbered nodes, and Redis.
SERVICE_NAME = re.compile(r"kafka|kafka-[1-9]|redis|postgres")
KILL_WAIT_S = 5.0
# Two readings of one process's start differ by up to a second: psutil derives it from the boot
# time, which the kernel reports in whole seconds and which can tick between two reads.
SAME_START_S = 1.5
LOG_ROTATE_BYTES = 8 * 1024 * 1024
START_BANNER = "--- hotswap: starting"
_JAVA_EXCEPTION = re.compile(r"^(?:[\w$]+\.)*[\w$]*(?:Exception|Error): ")
# Runs a command in the background with its output appended to a log, and prints its pid. The
# shell exits at once, so the service is nobody's child here: no zombies, no Popen to keep alive.
_SPAWN_SCRIPT = 'log="$1"; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'


@dataclass(frozen=True)
class Proc:
    """A process the stack started: its pid, when it started (to survive pid reuse), strings its
    command line must contain before we signal it, and its log."""

    pid: int
    started_s: float  # seconds after boot, see started_after_boot()
    markers: tuple[str, ...]
    log: str

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started_s": self.started_s, "markers": list(self.markers), "log": self.log}

    @classmethod
    def from_json(cls, raw: Any) -> Proc | None:
        """The entry as written by `to_json`, or None if it is not one."""
        if not isinstance(raw, dict):
            return None
        pid, started, markers, logfile = raw.get("pid"), raw.get("started_s"), raw.get("markers"), raw.get("log")
        if not (isinstance(pid, int) and isinstance(started, int | float) and isinstance(markers, list)):
            return None
        if not markers or not all(isinstance(m, str) for m in markers):
            return None
        return cls(pid, float(started), tuple(markers), logfile if isinstance(logfile, str) else "")


class ProcessState:
    """The state file: which service runs as which `Proc`. Callers hold `lock()` around changes."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / "stack.json"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        with locked(self.home / "stack.lock"):
            yield

    def read(self) -> dict[str, Proc]:
        """Every entry of the file, running or not; an unreadable file reads as empty."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("stack.state_unreadable", path=str(self.path), error=str(exc))
            return {}
        if not isinstance(raw, dict):
            return {}
        state: dict[str, Proc] = {}
        for name in sorted(raw):
            if not SERVICE_NAME.fullmatch(name):
                log.warning("stack.state_entry_unknown", service=name, path=str(self.path))
                continue
            proc = Proc.from_json(raw[name])
            if proc is None:  # say, edited by hand: we cannot tell whether that pid is ours
                log.warning("stack.state_entry_unreadable", service=name, path=str(self.path), entry=raw[name])
            else:
                state[name] = proc
        return state

    def live(self) -> dict[str, Proc]:
        """The entries whose process still runs and is still the one we started."""
        return {name: proc for name, proc in self.read().items() if is_ours(proc)}

    def write(self, state: dict[str, Proc]) -> None:
        # Write a temporary file and rename it: a reader never sees half a file.
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({name: proc.to_json() for name, proc in state.items()}, indent=2) + "\n")
        os.replace(tmp, self.path)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path`, held for the block (across processes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def spawn(title: str, command: list[str], logfile: Path, cwd: Path, markers: tuple[str, ...]) -> Proc:
    """Start `command` detached (own session, output appended to `logfile`) and describe it.
    `title` names the service in the log and in errors."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("a") as out:
        out.write(f"\n{START_BANNER} {title} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
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
        raise StackError(f"could not start {title} ({exc}); see {logfile}") from exc
    started = started_after_boot(pid)
    if started is None:
        hint = failure_hint(str(logfile))
        raise StackError(
            f"{title} exited at once{f' ({hint})' if hint else ''}; see {logfile}, fix it and run up again"
        )
    return Proc(pid, started, markers, str(logfile))


def terminate_all(procs: list[Proc], grace_s: float) -> None:
    """SIGTERM every process at once, wait up to `grace_s` for all, then SIGKILL what is left.
    The nodes of a Kafka cluster stop together: one stopped after the others would wait for a
    controller quorum that is already gone."""
    pending: list[Proc] = []
    for proc in procs:
        try:
            if _same_process(proc):
                psutil.Process(proc.pid).terminate()
                pending.append(proc)
        except psutil.NoSuchProcess:
            continue
        except psutil.Error as exc:
            raise StackError(f"could not stop pid {proc.pid} ({exc}); stop it by hand with `kill {proc.pid}`") from exc
    deadline = time.monotonic() + grace_s
    for proc in pending:
        if not _exits_within(proc, max(0.0, deadline - time.monotonic())):
            terminate(proc, 0.0)  # SIGTERM again is harmless; it then kills and waits


def is_ours(proc: Proc) -> bool:
    """True if `proc` still runs, is the very process we started, and its command line looks like ours."""
    if not _same_process(proc):
        return False  # gone, waiting to be reaped, or the pid now belongs to another process
    try:
        # Redis rewrites its title in place ("redis-server 127.0.0.1:6379"): match on the joined line.
        cmdline = " ".join(psutil.Process(proc.pid).cmdline())
    except psutil.Error:
        return False
    return all(marker in cmdline for marker in proc.markers)


def terminate(proc: Proc, grace_s: float) -> None:
    """SIGTERM, wait up to `grace_s`, then SIGKILL and wait a little more."""
    try:
        process = psutil.Process(proc.pid)
        if not _same_process(proc):
            return
        process.terminate()
        if _exits_within(proc, grace_s):
            return
        log.warning("stack.kill", pid=proc.pid, after_s=grace_s)
        process.kill()
        if _exits_within(proc, KILL_WAIT_S):
            return
    except psutil.NoSuchProcess:
        return
    except psutil.Error as exc:
        raise StackError(f"could not stop pid {proc.pid} ({exc}); stop it by hand with `kill {proc.pid}`") from exc
    raise StackError(f"pid {proc.pid} survived SIGKILL; check it with `ps -p {proc.pid}`")


def started_after_boot(pid: int) -> float | None:
    """Seconds from boot to the start of process `pid`, or None if it has exited. A zombie has
    exited: it only waits for its parent (here often an init that never reaps) to collect it."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        # Not the wall-clock create time itself: that moves whenever NTP or a resumed VM moves the
        # clock, and a stack that has run for weeks must still be recognised as ours.
        return round(process.create_time() - psutil.boot_time(), 2)  # ticks are 10 ms apart
    except psutil.Error:
        return None


def _same_process(proc: Proc) -> bool:
    started = started_after_boot(proc.pid)
    return started is not None and abs(started - proc.started_s) < SAME_START_S


def _exits_within(proc: Proc, timeout_s: float) -> bool:
    # Not psutil's wait(): for a process that is not our child it waits for the pid to vanish,
    # which a zombie never does.
    deadline = time.monotonic() + timeout_s
    while _same_process(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def listens(pid: int, port: int) -> bool:
    """True if process `pid` holds a socket listening on TCP `port` (False if we may not look)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections)


def port_open(port: int, host: str = LOCALHOST) -> bool:
    """True if something accepts TCP connections on the port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def rotate(logfile: Path) -> None:
    """Keep one previous log when the current one has grown large."""
    try:
        if logfile.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(logfile, logfile.with_name(logfile.name + ".1"))
    except FileNotFoundError:
        pass


def failure_hint(logfile: str) -> str:
    """The line of a service's log (since our last start) most likely to say why it stopped."""
    try:
        text = Path(logfile).read_text(errors="replace")
    except OSError:
        return ""
    start = text.rfind(START_BANNER)
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


def last_line(text: str) -> str:
    """The last non-blank line of a command's output, cut to a readable length."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
