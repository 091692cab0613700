"""Running the executor (in the test process or as its own), the generator, and reading topics back.

The oracle for the results is in oracle.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from pyspark.sql import SparkSession

from hotswap.contract.faults import CRASH_ENV
from hotswap.contract.models import GraphEngine
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.execution_graph.source import load_query_source
from hotswap.executor.control.controller import Executor
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.tools.generator import GeneratorSpec, produce
from hotswap.service_sink.audit import read_topic_records
from tests.conftest import wait_until
from tests.integration.oracle import KEEP_EVERY_BATCH

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / ".hotswap" / "jars"
QUERIES = Path(__file__).resolve().parent / "queries"


def namespace_settings(home: Path, bootstrap: str, redis_url: str, prefix: str, **extra: Any) -> Settings:
    """The settings of one test: a fresh namespace and topics, 10 s windows, 2 s of lateness. Many
    tests swap in .py queries, so Python queries are allowed (query_kinds); a test of the default
    passes query_kinds="sql"."""
    namespace = f"{prefix}{uuid.uuid4().hex[:8]}"
    extra.setdefault("query_kinds", "sql,python")
    return Settings(
        home=home,
        jars_dir=JARS,
        kafka_bootstrap=bootstrap,
        redis_url=redis_url,
        namespace=namespace,
        source_topic=f"{namespace}.events",
        sink_topic=f"{namespace}.results",
        window="10s",
        lateness="2s",
        idle_timeout="60s",
        **extra,
    )


def changed(settings: Settings, **changes: Any) -> Settings:
    """These settings with `changes`, validated as settings are (durations read from their text)."""
    return Settings.model_validate({**settings.model_dump(), **changes})


class RunningExecutor:
    """An executor in a background thread of the test process, sharing its SparkSession."""

    def __init__(self, settings: Settings, spark: SparkSession, query: Path) -> None:
        self.executor = Executor(settings, spark, redis_client(settings.control))
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
    except BaseException:
        print_spark_state(spark)  # before stop() ends the queries: what was each one doing?
        with contextlib.suppress(Exception):  # best effort: the diagnosis must not hide the failure
            for swap in Client(settings.control, settings.kafka, settings.pipeline).status().swaps:
                print(f"swap {swap.id} {swap.state}: {swap.waiting_for or swap.error or ''}")
        raise
    finally:
        running.stop()


def print_spark_state(spark: SparkSession) -> None:
    """Each active query's status and last progress, and the driver's heap, for a failed test's log."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
    used_mb = (runtime.totalMemory() - runtime.freeMemory()) // 2**20
    print(f"driver heap: {used_mb} MiB used of {runtime.maxMemory() // 2**20} MiB")
    for query in spark.streams.active:
        progress: dict[str, Any] = dict(query.lastProgress or {})
        print(
            f"query {query.name}: status={query.status} batch={progress.get('batchId')} "
            f"rows={progress.get('numInputRows')} at={progress.get('timestamp')} "
            f"eventTime={progress.get('eventTime')} exception={query.exception()}"
        )


class Load:
    """The generator, running in the background."""

    def __init__(self, settings: Settings, spec: GeneratorSpec) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=produce,
            args=(settings.kafka, spec, settings.source_topic, self._stop),
            daemon=True,
            name="test-load",
        )

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the generator and returns once its last event is in the topic."""
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the generator did not stop within 60 s"


@contextlib.contextmanager
def continuous_load(settings: Settings, spec: GeneratorSpec) -> Iterator[Load]:
    """Runs the generator in the background until the block ends (or `stop()` is called)."""
    load = Load(settings, spec).start()
    try:
        yield load
    finally:
        load.stop()


def committed_watermark(client: Client, query_id: str) -> int:
    """The watermark of the graph's last committed batch, as the service sink reported it (0 if none)."""
    graph = client.status().graphs.get(query_id)
    progress = graph.progress if graph else None
    return (progress.committed_watermark or 0) if progress else 0


@dataclass(frozen=True)
class FinalGraph:
    """The graph a test settles on (oracle.settle): its committed watermark, and the grid its
    windows end on if it runs on the closing engine, whose committed watermark is the last window
    end it closed."""

    client: Client
    query_id: str

    def __call__(self) -> int:
        return committed_watermark(self.client, self.query_id)

    def closes_on_ms(self) -> int | None:
        graph = self.client.status().graphs.get(self.query_id)
        if graph is None or graph.engine is not GraphEngine.CLOSING:
            return None
        return graph.slide_ms or graph.window_ms


def final_graph(client: Client, query_id: str) -> FinalGraph:
    return FinalGraph(client, query_id)


# -- queries made for tests ------------------------------------------------------------------------
QUERY_TEMPLATE = """
import os
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

STATE = {state!r}
LIVE_FROM = {live_from}  # rows from this event time on are this test's live events


def _count(counter):
    # How many times `counter` was counted. Kept in a file: Spark's Python workers are other
    # processes, and a restarted query must see the earlier counts.
    path = os.path.join(STATE, counter)
    return len(open(path).read()) if os.path.exists(path) else 0


def _tally(counter):
    # Count `counter` once more; returns the count before.
    before = _count(counter)
    with open(os.path.join(STATE, counter), "a") as f:
        f.write("x")
    return before


def _live_row(ts):
    if ts > LIVE_FROM:
{on_live_row}
    return ts


def query(events: DataFrame) -> DataFrame:
    calls = _tally("calls")  # validation makes the first call, each start of the query one more
{on_call}
    rows = events.where(F.udf(_live_row, "long")("ts") >= 0) if {per_row!r} else events
    return (
        rows.groupBy(F.window("event_time", "10 seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "key", "n",
                "total")
    )
"""


LIVE_FROM_2027 = 1_790_000_000_000


def python_query(
    tmp_path: Path, name: str, *, on_call: str = "", on_live_row: str = "", live_from: int = LIVE_FROM_2027
) -> Path:
    """The one Spark query the tests write: 10 s windows per key with `n` (count) and `total` (sum),
    as examples/count_per_key.sql computes them, in a Python file `<name>.py` with two hooks:
    `on_call` runs each time `query(events)` is called (`calls`: how many times before), and
    `on_live_row` for each live event (`ts`: from `live_from` on, by default this test's events from
    2027 on), where `_count(counter)` and `_tally(counter)` read and count across processes."""
    state = tmp_path / f"{name}.state"
    state.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.py"
    path.write_text(
        QUERY_TEMPLATE.format(
            state=str(state),
            on_live_row=_indented(on_live_row or "pass", 8),
            on_call=_indented(on_call or "pass", 4),
            per_row=bool(on_live_row),
            live_from=live_from,
        )
    )
    return path


def _indented(code: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line.strip() else "" for line in code.strip().splitlines())


def tally(tmp_path: Path, name: str, counter: str) -> int:
    """How often the query `name` counted `counter` (see python_query)."""
    path = tmp_path / f"{name}.state" / counter
    return len(path.read_text()) if path.exists() else 0


def slow_to_deploy(tmp_path: Path, sleep_s: float) -> Path:
    """A query whose definition takes `sleep_s` to build, each time (validation included)."""
    return python_query(tmp_path, "slow_to_deploy", on_call=f"time.sleep({sleep_s})")


def slow_to_start(tmp_path: Path, sleep_s: float) -> Path:
    """A query that validates at once but takes `sleep_s` to start, as one loading a model would."""
    return python_query(tmp_path, "slow_to_start", on_call=f"if calls >= 1: time.sleep({sleep_s})")


def fails_to_start(tmp_path: Path) -> Path:
    """A query that validates, then fails each time it is started."""
    return python_query(
        tmp_path, "broken_start", on_call="if calls >= 1: raise RuntimeError('cannot reach the feature store')"
    )


def stalls_once(tmp_path: Path, sleep_s: float) -> Path:
    """A query whose first batch of live events stalls for `sleep_s` (each of its tasks, once), as a query
    with a slow start would. Its tasks count `stalling` as they begin to stall, `stalled` when done."""
    stall = f"if _count('stalled') == 0:\n    _tally('stalling')\n    time.sleep({sleep_s})\n    _tally('stalled')"
    return python_query(tmp_path, "slow_start", on_live_row=stall)


def flaky(tmp_path: Path, failures: int) -> Path:
    """A query that fails on live events `failures` times in all, then works."""
    fail = f"if _count('failures') < {failures}:\n    _tally('failures')\n    raise RuntimeError('flaky dependency')"
    return python_query(tmp_path, "flaky", on_live_row=fail)


def fails_on_rows(tmp_path: Path, name: str) -> Path:
    """A query that fails on every batch with rows, for good."""
    return python_query(tmp_path, name, on_live_row="raise RuntimeError('model server unreachable')", live_from=0)


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
        for r in read_topic_records(settings.kafka, topic, timeout_s=60)
    ]


# -- the executor as a separate process (for crashes) ------------------------------------------------
def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that gives `python -m hotswap` these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTSWAP_")}
    values = {
        "HOME": str(settings.home),
        "JARS_DIR": str(settings.jar_cache),
        "KAFKA_BOOTSTRAP": settings.bootstrap,
        "REDIS_URL": settings.redis_dsn,
        "NAMESPACE": settings.namespace,
        "SOURCE_TOPIC": settings.source_topic,
        "SINK_TOPIC": settings.sink_topic,
        "WINDOW": str(settings.window),
        "LATENESS": str(settings.lateness),
        "IDLE_TIMEOUT": str(settings.idle_timeout or "off"),
        "LEASE_TTL": "6s",
        "LEASE_WAIT": "60s",
        "SPARK_DRIVER_MEMORY": "768m",
        "CONFIG_FILE": str(settings.home / "absent.toml"),
        "LOG_FORMAT": "json",
        "SPARK_CONF": json.dumps(KEEP_EVERY_BATCH),
        "TOPIC_REPLICATION_FACTOR": str(settings.topic_replication_factor),
        "GRAPH_ENGINE": str(settings.graph_engine),
        "SOURCE_PARTITIONS": str(settings.source_partitions),
        "QUERY_KINDS": ",".join(sorted(settings.query_kinds)),
    }
    if settings.graph_partitions is not None:
        values["GRAPH_PARTITIONS"] = str(settings.graph_partitions)
    if settings.sink is not None:
        values["SINK"] = settings.sink
    if settings.sink_url is not None:
        values["SINK_URL"] = settings.sink_url.get_secret_value()
    if settings.topic_min_insync_replicas is not None:
        values["TOPIC_MIN_INSYNC_REPLICAS"] = str(settings.topic_min_insync_replicas)
    if settings.checkpoint_root is not None:
        values["CHECKPOINT_ROOT"] = settings.checkpoint_root
    if settings.s3_endpoint is not None:
        values["S3_ENDPOINT"] = settings.s3_endpoint
    if settings.s3_access_key is not None and settings.s3_secret_key is not None:
        values["S3_ACCESS_KEY"] = settings.s3_access_key.get_secret_value()
        values["S3_SECRET_KEY"] = settings.s3_secret_key.get_secret_value()
    env.update({f"HOTSWAP_{k}": v for k, v in values.items()})
    env.update(extra)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def run_cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`hotswap ARGS` in a child process with these settings; returns when it exits."""
    return subprocess.run(
        [sys.executable, "-m", "hotswap", *args],
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
        env: dict[str, str] | None = None,
    ) -> None:
        extra = {CRASH_ENV: crash_at} if crash_at else {}
        extra.update(env or {})
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"executor-{crash_at or 'run'}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hotswap", "run", "--query", str(query), *args],
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
