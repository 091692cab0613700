"""An S3 server for the tests: s3proxy (org.gaul:s3proxy on Maven Central), started once per test
session on its filesystem backend, so every object it stores is a plain file below one directory.

Its jar is fetched with Maven into the tests' jar cache the first time. A bucket is a directory
under the backend's root; `local_copy` maps an s3a:// location to the directory that holds its
objects, so an oracle reads what the product wrote without going through the product's client.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

VERSION = "4.1.0"
ACCESS_KEY = "hotswap-tests"
SECRET_KEY = "hotswap-tests-secret"
START_TIMEOUT_S = 60.0
FETCH_TIMEOUT_S = 600.0
MAVEN_SETTINGS = Path(__file__).resolve().parents[2] / "compose" / "maven-settings.xml"

# Bucket name -> its directory, for every s3proxy this test session started.
_BUCKETS: dict[str, Path] = {}


def local_copy(location: str) -> Path:
    """The local directory behind a checkpoint location: itself, or the s3proxy directory of an s3a:// one."""
    if not location.startswith("s3a://"):
        return Path(location)
    bucket, _, key = location.removeprefix("s3a://").partition("/")
    return _BUCKETS[bucket] / key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3proxy_jar(jar_cache: Path) -> Path:
    """s3proxy's self-contained jar, fetched with Maven on first use."""
    directory = jar_cache / f"s3proxy-{VERSION}"
    jar = directory / f"s3proxy-{VERSION}-jar-with-dependencies.jar"
    if jar.is_file():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) fetches s3proxy for the tests and is not on PATH: run `make system-deps`")
    partial = Path(tempfile.mkdtemp(prefix=".s3proxy-", dir=jar_cache))
    command = [
        mvn,
        "-q",
        "-B",
        "-gs",
        str(MAVEN_SETTINGS),
        "dependency:copy",
        f"-Dartifact=org.gaul:s3proxy:{VERSION}:jar:jar-with-dependencies",
        f"-DoutputDirectory={partial}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    fetched = partial / jar.name
    if result.returncode != 0 or not fetched.is_file():
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(
            f"fetching s3proxy {VERSION} with Maven failed: {result.stdout[-500:]} {result.stderr[-500:]}"
        )
    directory.mkdir(parents=True, exist_ok=True)
    fetched.replace(jar)
    shutil.rmtree(partial, ignore_errors=True)
    return jar


class S3Proxy:
    """One s3proxy process with its data below `root` (made here)."""

    def __init__(self, jar_cache: Path, root: Path | None = None) -> None:
        self._jar = s3proxy_jar(jar_cache)
        self._root = root or Path(tempfile.mkdtemp(prefix="hotswap-s3proxy-"))
        self.data = self._root / "data"
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Proxy:
        self.data.mkdir(parents=True, exist_ok=True)
        properties = self._root / "s3proxy.properties"
        properties.write_text(
            f"s3proxy.endpoint={self.endpoint}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={ACCESS_KEY}\n"
            f"s3proxy.credential={SECRET_KEY}\n"
            "jclouds.provider=filesystem-nio2\n"
            f"jclouds.filesystem.basedir={self.data}\n"
        )
        with (self._root / "s3proxy.log").open("wb") as log:
            self._process = subprocess.Popen(
                ["java", "-Xmx128m", "-XX:+UseSerialGC", "-jar", str(self._jar), "--properties", str(properties)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            # Listening, and still alive: another process that took the port first would fail the check.
            if self._process.poll() is not None:
                failed = f"s3proxy exited at start: {self.log_tail()}"
                self.stop()
                raise RuntimeError(failed)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
            except OSError as exc:
                if time.monotonic() >= deadline:
                    failed = f"s3proxy did not listen within {START_TIMEOUT_S:.0f}s: {self.log_tail()}"
                    self.stop()
                    raise RuntimeError(failed) from exc
                time.sleep(0.2)
                continue
            if self._process.poll() is None:
                return self

    def bucket(self, name: str) -> str:
        """Make a bucket (a directory of the filesystem backend); returns its s3a:// URI."""
        directory = self.data / name
        directory.mkdir(parents=True, exist_ok=True)
        _BUCKETS[name] = directory
        return f"s3a://{name}"

    def log_tail(self, lines: int = 20) -> str:
        path = self._root / "s3proxy.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._root, ignore_errors=True)
