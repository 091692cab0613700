"""A PostgreSQL server for the postgres sink's tests: Debian's own binaries, started once per test
session in a temporary directory, with trust authentication on 127.0.0.1 only.

Postgres refuses to run as root: as root, the server and initdb run as the `postgres` user the
Debian package creates.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from pydantic import SecretStr

USER = "hotswap"
START_TIMEOUT_S = 60


def server_binaries() -> Path | None:
    """The newest installed server's bin directory (`make postgres` installs one), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """`root`: a directory of its own (made here); as root, the `postgres` user must reach it, so it
    goes directly under the system's temporary directory (pytest's are closed to other users)."""

    def __init__(self, root: Path | None = None) -> None:
        binaries = server_binaries()
        if binaries is None:
            raise RuntimeError("no PostgreSQL server is installed: run `make postgres`")
        self._bin = binaries
        self._root = root or Path(tempfile.mkdtemp(prefix="hotswap-postgres-"))
        self._data = self._root / "data"
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    @property
    def url_secret(self) -> SecretStr:
        return SecretStr(self.url)

    def start(self) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        as_root = os.geteuid() == 0
        if as_root:
            shutil.chown(self._root, "postgres", "postgres")
        self._run(
            [str(self._bin / "initdb"), "-D", str(self._data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"],
            as_root,
        )
        log = (self._root / "server.log").open("wb")
        command = [
            str(self._bin / "postgres"),
            "-D",
            str(self._data),
            "-p",
            str(self.port),
            "-k",
            str(self._root),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "shared_buffers=32MB",
        ]
        self._process = subprocess.Popen(self._wrap(command, as_root), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start; see {self._root / 'server.log'}") from None
                time.sleep(0.2)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self._root, ignore_errors=True)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()  # a smart shutdown: waits for nothing but its own clean-up
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    def _run(self, command: list[str], as_root: bool) -> None:
        done = subprocess.run(self._wrap(command, as_root), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(command[0]).name} failed: {(done.stderr or done.stdout).strip()}")

    @staticmethod
    def _wrap(command: list[str], as_root: bool) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *command] if as_root else command
