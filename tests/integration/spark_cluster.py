"""A Spark standalone cluster on this machine: one master and two workers, started with the pyspark
package's own `bin/spark-class`, so that tasks run in executor JVMs that the workers launch, apart
from the driver (the executor process).

Ports are fixed and used nowhere else in the tests: the master on 27077, the web UIs on 28080-28082
(the master's serves the cluster state as JSON). Every JVM gets a small heap, for a 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
import pyspark

from tests.conftest import wait_until

SPARK_HOME = Path(pyspark.__file__).resolve().parent
MASTER_PORT = 27077
MASTER_UI_PORT = 28080
WORKER_UI_PORTS = (28081, 28082)
WORKER_MEMORY = "1g"  # what a worker offers; each executor takes EXECUTOR_CONF's 512m of it
# The Spark conf an application needs on this cluster: one 512 MiB, one-core executor per worker.
EXECUTOR_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": str(len(WORKER_UI_PORTS)),
    "spark.executor.extraJavaOptions": "-XX:+UseSerialGC",
}


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]


@dataclass
class StandaloneCluster:
    root: Path
    daemons: list[_Daemon] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{MASTER_PORT}"

    def worker_dir(self, index: int) -> Path:
        return self.root / f"worker-{index}"

    def start(self, timeout_s: float = 120) -> StandaloneCluster:
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(MASTER_PORT),
            "--webui-port",
            str(MASTER_UI_PORT),
        )
        wait_until(lambda: self.state() is not None, timeout_s, "the Spark master to answer")
        for index, ui_port in enumerate(WORKER_UI_PORTS):
            work = self.worker_dir(index)
            work.mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker-{index}",
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                WORKER_MEMORY,
                "--webui-port",
                str(ui_port),
                "--work-dir",
                str(work),
            )
        wait_until(lambda: self.alive_workers() == len(WORKER_UI_PORTS), timeout_s, "both workers to register")
        return self

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": "-XX:+UseSerialGC",
            # The executors' Python workers run the driver's interpreter; the same one is named here
            # for anything the workers start themselves.
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_CONF_DIR": str(self.root / "conf"),  # empty: no spark-defaults.conf from elsewhere
        }
        (self.root / "conf").mkdir(parents=True, exist_ok=True)
        log_path = self.root / f"{name}.log"
        log = log_path.open("wb")
        # spark-class ends in `exec java ...`, so the pid is the daemon's JVM.
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
        )
        self.daemons.append(_Daemon(name, process, log_path, log))

    def state(self) -> dict[str, Any] | None:
        """The master's view of the cluster (its web UI's JSON), or None while it does not answer."""
        for daemon in self.daemons:
            if daemon.process.poll() is not None:
                raise AssertionError(
                    f"Spark {daemon.name} exited with {daemon.process.returncode}; see {daemon.log_path}"
                )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{MASTER_UI_PORT}/json/", timeout=5) as response:
                state: dict[str, Any] = json.load(response)
                return state
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def executor_logs(self) -> list[Path]:
        """Each executor's stderr, as the workers keep it: <work dir>/<app id>/<executor id>/stderr."""
        return sorted(self.root.glob("worker-*/app-*/*/stderr"))

    def describe(self) -> str:
        """The cluster's state and each daemon's last lines, for a failed test's log."""
        try:
            lines = [f"cluster state: {json.dumps(self.state())[:2000]}"]
        except AssertionError as exc:  # a daemon exited: say so, and still show every log
            lines = [str(exc)]
        for path in [d.log_path for d in self.daemons] + self.executor_logs():
            tail = path.read_bytes().decode(errors="replace").splitlines()[-15:]
            lines += [f"--- {path}", *tail]
        return "\n".join(lines)

    def stop(self) -> None:
        """Workers first (each kills its executors), then the master; nothing they started survives."""
        for daemon in reversed(self.daemons):
            children: list[psutil.Process] = []
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(daemon.process.pid).children(recursive=True)
            if daemon.process.poll() is None:
                daemon.process.terminate()
                try:
                    daemon.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.process.kill()
                    daemon.process.wait(timeout=30)
            for child in children:
                with contextlib.suppress(psutil.Error):
                    child.kill()
            daemon.log.close()
        self.daemons.clear()
