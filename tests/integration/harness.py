"""Running the executor inside the test process, and an offline oracle for the results."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from pyspark.sql import SparkSession

from contract.faults import CRASH_ENV
from contract.keys import Keys
from contract.settings import Settings
from execution_graph.source import load_query_source
from executor.control.controller import Executor
from executor.operator.client import Client, redis_client
from service_sink.audit import Result, read_topic_records
from tests.conftest import wait_until
from tools.generator import GeneratorSpec, produce

REPO = Path(__file__).resolve().parents[2]
QUERIES = Path(__file__).resolve().parent / "queries"


class RunningExecutor:
    """An executor in a background thread of the test process, sharing its SparkSession."""

    def __init__(self, settings: Settings, spark: SparkSession, query: Path) -> None:
        self.executor = Executor(settings, spark, redis_client(settings))
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(query,), daemon=True, name="test-executor")

    def _run(self, query: Path) -> None:
        try:
            self.executor.run(load_query_source(query), self._stop)
        except BaseException as exc:
            self._errors.append(exc)
            raise

    def start(self) -> RunningExecutor:
        self._thread.start()
        wait_until(lambda: self.executor.ready.is_set() or not self._thread.is_alive(), 240, "the executor to run")
        self.check()
        return self

    def check(self) -> None:
        if self._errors:
            raise AssertionError(f"executor died: {self._errors[0]!r}") from self._errors[0]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "executor did not stop within 120 s"


@contextlib.contextmanager
def executor_running(settings: Settings, spark: SparkSession, query: Path) -> Iterator[RunningExecutor]:
    running = RunningExecutor(settings, spark, query).start()
    try:
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def continuous_load(settings: Settings, spec: GeneratorSpec) -> Iterator[threading.Event]:
    """Runs the generator in the background until the block ends (or the event is set)."""
    stop = threading.Event()
    thread = threading.Thread(target=produce, args=(settings, spec, settings.source_topic, stop), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=60)


def committed_watermark(client: Client, query_id: str) -> int:
    """The watermark of the graph's last committed batch, as the service sink reported it (0 if none)."""
    graph = client.status().graphs.get(query_id)
    progress = graph.progress if graph else None
    return (progress.committed_watermark or 0) if progress else 0


# -- queries made for tests ------------------------------------------------------------------------
def slow_to_deploy(tmp_path: Path, sleep_s: float) -> Path:
    """A Python query whose definition takes `sleep_s` to build, as a query with a slow start would."""
    path = tmp_path / "slow_to_deploy.py"
    path.write_text(
        f"""
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def query(events: DataFrame) -> DataFrame:
    time.sleep({sleep_s})
    return (
        events.groupBy(F.window("event_time", "10 seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "key", "n",
                "total")
    )
"""
    )
    return path


# -- reading topics back ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


def read_topic(settings: Settings, topic: str) -> list[Record]:
    return [
        Record(r.partition, r.offset, r.key, r.value, dict(r.headers or []))
        for r in read_topic_records(settings, topic, timeout_s=60)
    ]


@dataclass(frozen=True)
class SourceEvent:
    partition: int
    offset: int
    key: str
    value: float
    ts: int


def source_events(settings: Settings) -> list[SourceEvent]:
    events = []
    for r in read_topic(settings, settings.source_topic):
        body = json.loads(r.value)
        events.append(SourceEvent(r.partition, r.offset, body["key"], float(body["value"]), int(body["ts"])))
    return events


def late_event_ids(settings: Settings) -> set[tuple[int, int]]:
    return {
        (int(b["partition"]), int(b["offset"]))
        for b in (json.loads(r.value) for r in read_topic(settings, settings.late_topic))
    }


# -- the oracle ------------------------------------------------------------------------------------
Aggregate = Callable[[list[SourceEvent]], dict[str, float]]


def count_and_total(events: list[SourceEvent]) -> dict[str, float]:
    return {"n": len(events), "total": sum(e.value for e in events)}


def peak_and_low(events: list[SourceEvent]) -> dict[str, float]:
    return {"peak": max(e.value for e in events), "low": min(e.value for e in events)}


def mean_and_n(events: list[SourceEvent]) -> dict[str, float]:
    return {"mean": sum(e.value for e in events) / len(events), "n": len(events)}


@dataclass(frozen=True)
class Version:
    query_id: str
    window_ms: int
    aggregate: Aggregate


def expected_results(
    events: list[SourceEvent], versions: list[Version], cuts: list[int], closed_until: int
) -> dict[tuple[int, str], tuple[str, int, dict[str, float]]]:
    """(window_start, key) -> (owning query, window_end, values) for every closed window.

    Version i owns event times in [cuts[i-1], cuts[i]); windows close when their end is at or
    before `closed_until`.
    """
    bounds = [-math.inf, *cuts, math.inf]
    grouped: dict[tuple[int, str, int], list[SourceEvent]] = defaultdict(list)
    for e in events:
        for i, version in enumerate(versions):
            if bounds[i] <= e.ts < bounds[i + 1]:
                start = (e.ts // version.window_ms) * version.window_ms
                grouped[(i, e.key, start)].append(e)
                break
    out: dict[tuple[int, str], tuple[str, int, dict[str, float]]] = {}
    for (i, key, start), group in grouped.items():
        version = versions[i]
        end = start + version.window_ms
        if end <= closed_until:
            out[(start, key)] = (version.query_id, end, version.aggregate(group))
    return out


def same_result(a: Result, b: Result) -> bool:
    """The same record under the same key; a float may differ in its last bits, because a replayed
    batch can add the same values in another order."""
    if a.key != b.key or a.row.keys() != b.row.keys():
        return False
    for column, value in a.row.items():
        other = b.row[column]
        if isinstance(value, float) and isinstance(other, float):
            if not math.isclose(value, other, rel_tol=1e-9):
                return False
        elif value != other:
            return False
    return True


def assert_invariants(
    results: list[Result],
    events: list[SourceEvent],
    versions: list[Version],
    cuts: list[int],
    closed_until: int,
    *,
    allow_redelivery: bool = False,
) -> None:
    """Exactly once per (window, group), owned by the right version, no gap, correct values.

    With `allow_redelivery` (after a crash) a result may appear twice in the topic, but only as
    the identical record with the same key (a replayed batch overwriting itself).
    """
    seen: dict[tuple[int, str], Result] = {}
    for r in results:
        identity = (r.window_start, str(r.row["key"]))
        if identity in seen and allow_redelivery and same_result(seen[identity], r):
            continue
        assert identity not in seen, f"duplicate result for window {identity}: {seen[identity].row} and {r.row}"
        seen[identity] = r
    expected = expected_results(events, versions, cuts, closed_until)
    missing = sorted(set(expected) - set(seen))
    assert not missing, f"{len(missing)} closed (window, key) results missing, first {missing[:5]}"
    for identity, result in seen.items():
        if identity not in expected:
            # A window that closed after `closed_until` may already be out; it must still be owned right.
            continue
        owner, end, values = expected[identity]
        assert result.query_id == owner, f"window {identity} answered by {result.query_id}, owner is {owner}"
        assert result.window_end == end, f"window {identity} ends at {result.window_end}, expected {end}"
        for name, value in values.items():
            assert math.isclose(float(result.row[name]), value, rel_tol=1e-9, abs_tol=1e-6), (
                f"window {identity} {name}={result.row[name]}, recomputed {value}"
            )
    # Ownership for every result, closed or not: at or before W the old version, after it the new.
    bounds = [-math.inf, *cuts, math.inf]
    for r in results:
        version = next(v for i, v in enumerate(versions) if bounds[i] <= r.window_start < bounds[i + 1])
        assert r.query_id == version.query_id, f"window starting {r.window_start} answered by {r.query_id}"


# -- the executor as a separate process (for crashes) ------------------------------------------------
def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that gives `python -m executor` these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTSWAP_")}
    values = {
        "HOME": str(settings.home),
        "JARS_DIR": str(settings.jar_cache),
        "KAFKA_BOOTSTRAP": settings.bootstrap,
        "REDIS_URL": settings.redis_dsn,
        "NAMESPACE": settings.namespace,
        "SOURCE_TOPIC": settings.source_topic,
        "SINK_TOPIC": settings.sink_topic,
        "WINDOW": settings.window,
        "LATENESS": settings.lateness,
        "IDLE_TIMEOUT": settings.idle_timeout,
        "LEASE_TTL": "6s",
        "LEASE_WAIT": "60s",
        "SPARK_DRIVER_MEMORY": "768m",
        "CONFIG_FILE": str(settings.home / "absent.toml"),
        "LOG_FORMAT": "json",
    }
    env.update({f"HOTSWAP_{k}": v for k, v in values.items()})
    env.update(extra)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def run_cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`hotswap ARGS` in a child process with these settings; returns when it exits."""
    return subprocess.run(
        [sys.executable, "-m", "executor", *args],
        env=settings_env(settings, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class ExecutorProcess:
    """`hotswap run` in a child process, optionally told to crash itself at a crash point."""

    def __init__(
        self,
        settings: Settings,
        query: Path,
        log_dir: Path,
        crash_at: str | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        extra = {CRASH_ENV: crash_at} if crash_at else {}
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"executor-{crash_at or 'run'}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "executor", "run", "--query", str(query), *args],
            env=settings_env(settings, **extra),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def wait_serving(self, control: redis.Redis, keys: Keys, timeout_s: float = 180) -> None:
        """Until this process holds the namespace's lease and has started its queries."""
        marker = f":{self.process.pid}:"

        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"executor exited with {self.process.returncode}; see {self.log_path}")
            holder = control.get(keys.lease)
            text = holder.decode() if isinstance(holder, bytes) else str(holder)
            return marker in text and b"executor running" in self.log_path.read_bytes()

        wait_until(serving, timeout_s, "the executor process to serve")

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"executor still running after {timeout_s:.0f}s; see {self.log_path}") from exc

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._log.close()
