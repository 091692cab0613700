"""The one place a SparkSession is built, from settings.

Local mode is the default; a cluster master URL or extra Spark conf comes from settings
(`spark_master`, `spark_conf`), so moving to a cluster changes configuration, not code.
Spark's Kafka connector comes from the jars directory if it holds it, else from Maven Central
(see `connector_conf`). Spark Connect is refused (`check_spark_target`). A driver maps in the
class-data archive `hotswap stack fetch` dumped, when there is one (`archive_classes`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from hotswap.contract.settings import SparkSettings
from hotswap.executor.errors import SparkConnectUnsupported
from hotswap.executor.spark_connector import (
    connector_package,
    local_connector_jars,
    local_object_store_jars,
    object_store_package,
    pyspark_version,
)

log = structlog.get_logger(__name__)

# Small defaults for a shared 2-core machine; any of them can be overridden by settings.spark_conf.
_DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stateStore.maintenanceInterval": "30s",
    "spark.sql.streaming.minBatchesToRetain": "20",
    # The driver's status store keeps every job, stage and SQL execution up to these limits even
    # with the UI off. A permanent streaming driver runs a few executions a second, so the
    # defaults (1,000 of each, with their plans) fill a small heap for nothing.
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.ui.retainedTasks": "2000",
    "spark.ui.retainedDeadExecutors": "10",
    "spark.sql.ui.retainedExecutions": "20",
    "spark.sql.streaming.ui.retainedQueries": "20",
    "spark.sql.streaming.ui.retainedProgressUpdates": "20",
    # Kafka through DataSource V2: its writer delivers the service graph's observed batch statistics,
    # the V1 writer does not (service_graph/frames.py). The rest of Spark's default list stays V1.
    "spark.sql.sources.useV1SourceList": "avro,csv,json,orc,parquet,text",
    # PySpark records the Python call site of every Column and function call for Spark's error
    # messages: four to five py4j round trips and a stack walk per call, and hotswap builds a plan of
    # dozens of them per batch, on the driver (a 40-aggregate build: 211-270 ms with it, 77-128 ms
    # without, warm and idle). The JVM side collects a stack trace per DataFrame call for the same.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    "spark.sql.dataFrameQueryContext.enabled": "false",
    # Spark writes the plan of every execution (each micro-batch, each close job) into its SQL
    # listener event at once, on the thread that runs it, UI or not. The default "formatted" text
    # of a 40-aggregate plan took 45-50 ms to build; "simple" 2-3 ms (warm, idle).
    "spark.sql.ui.explainMode": "simple",
    # hotswap needs neither pandas nor pyarrow; plain Python UDFs (in user .py queries) stay plain.
    "spark.sql.execution.pythonUDF.arrow.enabled": "false",
    # A submitted query reads no file by naming it (SELECT ... FROM text.`/etc/passwd`): it reads its
    # events and the operator's static tables (execution_graph/confinement.py).
    "spark.sql.runSQLOnFiles": "false",
}
# A Delta Lake sink (service_sink/delta.py): Delta 4 writes only through its extension and catalog. Its
# table snapshots are rebuilt with 50 tasks by default, seconds per commit on two cores.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
}
# A larger thread stack: Spark matches long Python tracebacks (a foreachBatch interrupted by
# stop()) with a recursive regex that overflows the default 1 MB stack. The log4j2 configuration
# is hotswap's (spark_log4j2 below), written under home.
_DRIVER_JVM = "-XX:+UseSerialGC -Xss16m"
_DRIVER_JAVA_OPTIONS = _DRIVER_JVM + " -Dlog4j2.configurationFile={log4j2}"

# The driver's log4j2 configuration, written at every start (spark_log4j2): Spark's console format
# on stderr, at the level `spark_log_level` sets, except for
# - the lines Spark logs when a task or a streaming query fails: a whole Java stack trace, and for a
#   failed `foreachBatch` the "An exception was raised by the Python Proxy" wrapper with a Python
#   traceback inside. hotswap reports each such failure on the console itself, in one line with its
#   root cause (contract/causes.py), so Spark's lines go to `<home>/logs/spark.log`, whole;
# - "Uncaught exception in thread executor-heartbeater" (a NullPointerException): a local-mode
#   executor reporting the metrics of a task that stop() just killed. Nothing is wrong, and the
#   heartbeat runs again a few seconds later;
# - NativeCodeLoader's warning that Hadoop's native library is missing (the Java code is used).
_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.streaming",
    "org.apache.spark.sql.execution.datasources",
    "org.apache.spark.util.Utils",
)
_LOG4J2_HEAD = """\
# Written by hotswap (executor/control/spark_session.py) at every start; changes are overwritten.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
appender.console.filter.heartbeat.type = RegexFilter
appender.console.filter.heartbeat.regex = .*Uncaught exception in thread executor-heartbeater.*
appender.console.filter.heartbeat.onMatch = DENY
appender.console.filter.heartbeat.onMismatch = NEUTRAL
appender.file.type = File
appender.file.name = file
appender.file.fileName = {spark_log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
"""


def spark_log4j2(spark_log: Path) -> str:
    """The driver's log4j2 configuration (see above), Spark's failure lines going to `spark_log`."""
    failures = "".join(
        f"logger.failure{i}.name = {name}\n"
        f"logger.failure{i}.additivity = false\n"
        f"logger.failure{i}.appenderRef.file.ref = file\n"
        for i, name in enumerate(_FAILURE_LOGGERS)
    )
    return _LOG4J2_HEAD.replace("{spark_log}", str(spark_log)) + failures


# Only in local mode: on a cluster, executors on other machines must reach the driver at an address
# they can route to, which Spark finds itself (or SPARK_LOCAL_IP / spark.driver.host say).
_LOCAL_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}

# Checkpoints on this machine's disk (a local master, not an object store): Spark's default writes each
# streaming metadata file through Hadoop's FileContext, whose rename on the local file system forks
# `readlink` from the driver's JVM, for the two files of each batch and their checksums. Renaming
# through the FileSystem API is one system call, with the same check that the file is not there yet:
# a trivial query's offset and commit logs took 17-22 and 25-29 ms a batch instead of 68-72 and
# 112-128 (idle). Elsewhere (HDFS behind a cluster's default file system, an object store) Spark's
# default stays: the gain is the local file system's, and HDFS's rename does not replace a file.
# The class's package is Spark 4.2's (pyspark is pinned; a test checks the jar holds it).
LOCAL_CHECKPOINT_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}

_CONNECT_REFUSED = (
    "Spark Connect is not supported ({target}): hotswap routes each batch in a foreachBatch that shares "
    "state with the executor's Python process and reads query plans and checkpoints through the driver's "
    "JVM, and a Spark Connect client has neither; run the executor as the Spark driver with --spark-master "
    "(local[*], spark://..., k8s://...) instead"
)


def is_local_master(master: str) -> bool:
    """Whether the driver runs every task itself (local, local[N], local[*], local-cluster[...])."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def check_spark_target(settings: SparkSettings) -> None:
    """Refuse, before anything starts, every way PySpark could be steered into Spark Connect mode."""
    conf = settings.spark_conf
    candidates = {
        "--spark-remote": settings.spark_remote,
        "spark.remote": conf.get("spark.remote"),
        "spark.api.mode": conf.get("spark.api.mode") if conf.get("spark.api.mode", "").lower() == "connect" else None,
        "SPARK_REMOTE": os.environ.get("SPARK_REMOTE"),
        "SPARK_API_MODE": os.environ.get("SPARK_API_MODE")
        if os.environ.get("SPARK_API_MODE", "").lower() == "connect"
        else None,
        "--spark-master": settings.spark_master if settings.spark_master.startswith("sc://") else None,
    }
    for origin, value in candidates.items():
        if value:
            raise SparkConnectUnsupported(_CONNECT_REFUSED.format(target=f"{origin} {value}"))


def log4j2_file(settings: SparkSettings) -> Path:
    """Where the driver's log4j2 configuration is written (spark_log4j2)."""
    return (settings.home_dir / "spark-log4j2.properties").expanduser().resolve()


def spark_log_file(settings: SparkSettings) -> Path:
    """Where Spark's task and query failure lines go, whole (spark_log4j2)."""
    return (settings.home_dir / "logs" / "spark.log").expanduser().resolve()


def session_conf(settings: SparkSettings) -> dict[str, str]:
    """Every Spark conf the session is built with, settings' own last."""
    java_options = _DRIVER_JAVA_OPTIONS.format(log4j2=log4j2_file(settings))
    archive = class_archive(settings.jar_cache)
    if archive.is_file():
        java_options += f" -XX:SharedArchiveFile={archive}"
    return {
        **_DEFAULT_CONF,
        "spark.driver.extraJavaOptions": java_options,
        **(_LOCAL_CONF if is_local_master(settings.spark_master) else {}),
        "spark.driver.memory": settings.spark_driver_memory,
        **connector_conf(settings),
        **(DELTA_CONF if settings.delta_lake else {}),
        **object_store_conf(settings),
        **(LOCAL_CHECKPOINT_CONF if is_local_master(settings.spark_master) and not settings.object_store else {}),
        **settings.spark_conf,  # last: settings override every default
    }


def connector_conf(settings: SparkSettings) -> dict[str, str]:
    """The Spark conf that adds the Kafka connector, which the pyspark wheel does not ship, and
    Hadoop's S3 client when the checkpoints are on an object store."""
    # Jars that `hotswap stack fetch` left in the jars directory come first: copied there, they let
    # an air-gapped machine run. Otherwise Spark resolves them from Maven Central itself (Ivy), so
    # running needs Java and Python but no Maven; its Ivy cache stays under home.
    jars: list[Path] = []
    packages: list[str] = []
    connector = local_connector_jars(settings.jar_cache)
    if connector is None:
        packages.append(connector_package())
    else:
        jars += connector
    if settings.object_store:
        s3 = local_object_store_jars(settings.jar_cache)
        if s3 is None:
            packages.append(object_store_package())
        else:
            jars += s3
    conf: dict[str, str] = {}
    if jars:
        log.info("spark.connector", jars=str(jars[0].parent))
        conf["spark.jars"] = ",".join(str(jar) for jar in jars)
    if packages:
        ivy = settings.home_dir.expanduser().resolve() / "ivy"
        log.info("spark.connector", packages=packages, ivy=str(ivy))
        conf |= {"spark.jars.packages": ",".join(packages), "spark.jars.ivy": str(ivy)}
    return conf


def object_store_conf(settings: SparkSettings) -> dict[str, str]:
    """Hadoop's S3 client settings for a checkpoint root on s3a:// (none otherwise); its keys are
    not among them (object_store_keys)."""
    if not settings.object_store:
        return {}
    s3a = "spark.hadoop.fs.s3a."
    conf: dict[str, str] = {}
    if settings.s3_endpoint is not None:
        conf[s3a + "endpoint"] = settings.s3_endpoint
        conf[s3a + "connection.ssl.enabled"] = str(settings.s3_endpoint.startswith("https://")).lower()
    # A store other than AWS takes any region; on AWS, none lets the client find the bucket's own.
    region = settings.s3_region or ("us-east-1" if settings.s3_endpoint is not None else None)
    if region is not None:
        conf[s3a + "endpoint.region"] = region
    path_style = settings.s3_path_style if settings.s3_path_style is not None else settings.s3_endpoint is not None
    conf[s3a + "path.style.access"] = str(path_style).lower()
    if settings.s3_access_key is not None:
        conf[s3a + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return conf


def object_store_keys(settings: SparkSettings) -> dict[str, str]:
    """The S3 keys, for the driver's Hadoop configuration once the session runs: pyspark passes
    every conf of the builder to spark-submit on its command line, which any user of the machine
    reads (ps). The streaming queries' state stores take them from the driver's configuration."""
    if not settings.object_store or settings.s3_access_key is None or settings.s3_secret_key is None:
        return {}
    return {
        "fs.s3a.access.key": settings.s3_access_key.get_secret_value(),
        "fs.s3a.secret.key": settings.s3_secret_key.get_secret_value(),
    }


def build_spark_session(settings: SparkSettings) -> SparkSession:
    check_spark_target(settings)
    # Without these, Python workers fail to connect back to the driver (docs/architecture.md, "Known traps").
    # On a cluster, executors start Python workers with the driver's interpreter path: the same
    # virtualenv must exist at that path on every worker (or PYSPARK_PYTHON names theirs).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local_master(settings.spark_master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j2, spark_log = log4j2_file(settings), spark_log_file(settings)
    spark_log.parent.mkdir(parents=True, exist_ok=True)
    log4j2.write_text(spark_log4j2(spark_log))
    builder = SparkSession.builder.master(settings.spark_master).appName(settings.app_name)
    for key, value in session_conf(settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in object_store_keys(settings).items():
        hadoop.set(key, value)
    spark.sparkContext.setLogLevel(settings.spark_log_level.upper())
    return spark


# -- the class-data archive ----------------------------------------------------------------------
# A driver JVM spends most of its start loading Spark's classes. Java's class-data sharing maps in
# the classes an earlier JVM dumped at its exit (-XX:ArchiveClassesAtExit, then -XX:SharedArchiveFile),
# which takes a session's start from about 8 s to 5 s on a 2-core machine (docs/performance.md): the time an executor
# takes to come back after a crash or a restart. `hotswap stack fetch` dumps the archive once, in a
# JVM of its own. Its name carries the pyspark version and the Java build; a Java that still cannot
# use it (another class path, say) ignores it and starts as it would without.
ARCHIVE_TIMEOUT_S = 600.0


def class_archive(jar_cache: Path) -> Path:
    """Where the archive of this pyspark and this Java is, or would be."""
    return jar_cache / f"spark-classes-{pyspark_version()}-{_java_build()}.jsa"


def _java_build() -> str:
    """The java binary Spark's launcher runs (JAVA_HOME's, else the one on PATH), as a short digest."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if java is None or not Path(java).is_file():
        return "no-java"
    binary = Path(java).resolve()
    stat = binary.stat()
    return hashlib.sha256(f"{binary}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]


def archive_classes(settings: SparkSettings) -> Path | None:
    """The class-data archive, dumped first if there is none; None (said in a warning) if Java could
    not dump one: every driver then starts without it, as before."""
    archive = class_archive(settings.jar_cache)
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    # Dumped beside its final name and renamed once whole: a driver never maps half an archive.
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    started = time.monotonic()
    command = [sys.executable, "-c", f"from {__name__} import _dump_classes; _dump_classes()", str(partial)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=ARCHIVE_TIMEOUT_S, check=False)
        failure = None if result.returncode == 0 else _last_line(result.stderr) or f"exit code {result.returncode}"
    except subprocess.TimeoutExpired:
        failure = f"no archive within {ARCHIVE_TIMEOUT_S:.0f}s"
    if failure is None and partial.is_file() and partial.stat().st_size > 0:
        partial.replace(archive)
        log.info("spark.class_archive", path=str(archive), seconds=round(time.monotonic() - started, 1))
        return archive
    partial.unlink(missing_ok=True)
    log.warning("spark.class_archive.skipped", reason=failure or "Java wrote no archive; drivers start without one")
    return None


def _last_line(text: str) -> str:
    """The line that says why: the last one naming an error (Java's, Spark's or Python's), else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or [""])[-1]


def _dump_classes() -> None:
    """Run in a child process by archive_classes: start Spark as a driver does, run a batch and a
    stateful streaming query through foreachBatch, and let the JVM write the classes it loaded."""
    partial = Path(sys.argv[1])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The driver's own Java options (the archive holds classes for one GC), plus the dump.
    java_options = f"{_DRIVER_JVM} -XX:ArchiveClassesAtExit={partial}"
    builder = SparkSession.builder.master("local[1]").appName("hotswap-class-archive")
    for key, value in {**_DEFAULT_CONF, **_LOCAL_CONF, "spark.driver.extraJavaOptions": java_options}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    events = spark.range(1000).selectExpr("CAST(id % 3 AS STRING) AS key", "timestamp_millis(id * 100) AS ts")
    events.groupBy(F.window("ts", "10 seconds"), "key").agg(F.count("*"), F.max("ts")).collect()
    checkpoint = partial.with_name(partial.name + ".checkpoint")
    stream = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .withWatermark("timestamp", "1 second")
        .groupBy(F.window("timestamp", "1 second"))
        .count()
    )

    def count(frame: DataFrame, _batch: int) -> None:
        frame.count()

    query = (
        stream.writeStream.outputMode("append")
        .foreachBatch(count)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    query.processAllAvailable()
    query.stop()
    gateway = spark.sparkContext._gateway
    spark.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    # The JVM writes the archive as it exits, which it does when its stdin closes: wait for it.
    if gateway is not None and gateway.proc is not None:
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=ARCHIVE_TIMEOUT_S)
