"""The embedded PostgreSQL server, for the postgres sink (`hotswap stack up --postgres`): Debian's own
binaries, its data under `<home>/postgres/data`, trust authentication on 127.0.0.1 only.

PostgreSQL refuses to run as root: as root, initdb and the server run as the `postgres` user the
Debian package creates (setpriv, which execs, so the pid the stack records is the server's own), and
that user must be able to reach hotswap's home.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import structlog

from hotswap.contract.settings import StackSettings
from hotswap.executor.errors import StackError
from hotswap.executor.stack.process import LOCALHOST, Proc, port_open, rotate, spawn
from hotswap.executor.stack.service import Service

log = structlog.get_logger(__name__)

USER = "hotswap"  # the database role initdb creates; trust authentication, from 127.0.0.1 only
SERVER_GLOB = "/usr/lib/postgresql/*/bin/postgres"
INITDB_TIMEOUT_S = 120.0


def server_binaries() -> Path | None:
    """The newest installed server's bin directory (`make postgres` installs one), or None."""
    found = sorted(Path("/").glob(SERVER_GLOB.lstrip("/")), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


class PostgresServer(Service):
    name = "postgres"
    title = "PostgreSQL"
    env = "HOTSWAP_SINK_URL"
    stop_grace_s = 30.0

    def __init__(self, stack: StackSettings, home: Path) -> None:
        super().__init__(stack, home, external=False, ports=(stack.postgres_port,))

    @property
    def url(self) -> str:
        """The sink URL of the embedded server (no password: trust, on the loopback only)."""
        return f"postgresql://{USER}@{LOCALHOST}:{self.port}/postgres"

    def address(self) -> str:
        return self.url

    def answers(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            with psycopg.connect(self.url, connect_timeout=2) as connection:
                connection.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def start(self) -> Proc:
        """Create the cluster on first use, then start the server detached on the embedded port."""
        binaries = server_binaries()
        if binaries is None:
            raise StackError(
                "PostgreSQL's server is not installed; install the Debian package postgresql (`make postgres`)"
            )
        data = self.dir / "data"
        self.dir.mkdir(parents=True, exist_ok=True)
        as_root = os.geteuid() == 0
        if as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        if not (data / "PG_VERSION").is_file():
            self._initdb(binaries, data, as_root)
        logfile = self.dir / "postgres.log"
        rotate(logfile)
        port = str(self.port)
        command = [
            *(_as_postgres() if as_root else []),
            str(binaries / "postgres"),
            "-D",
            str(data),
            "-p",
            port,
            "-k",
            str(self.dir),
            "-c",
            f"listen_addresses={LOCALHOST}",
        ]
        log.info("stack.postgres.starting", port=self.port, log=str(logfile))
        return spawn(self.title, command, logfile, self.dir, ("postgres", str(data), port))

    def _initdb(self, binaries: Path, data: Path, as_root: bool) -> None:
        command = [
            *(_as_postgres() if as_root else []),
            str(binaries / "initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            "--auth=trust",
            "-E",
            "UTF8",
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=INITDB_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"initdb did not finish within {INITDB_TIMEOUT_S:.0f}s in {data}") from exc
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            why = lines[-1] if lines else f"exit code {done.returncode}"
            reach = " (as root, the postgres user must be able to reach hotswap's home)" if as_root else ""
            raise StackError(f"initdb failed in {data}: {why}{reach}")


def _as_postgres() -> list[str]:
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
