"""The one place a SparkSession is built, from settings.

Local mode is the default; a cluster master URL or extra Spark conf comes from settings
(`spark_master`, `spark_conf`), so moving to a cluster changes configuration, not code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from contract.settings import Settings

# Small defaults for a shared 2-core machine; any of them can be overridden by settings.spark_conf.
_DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stateStore.maintenanceInterval": "30s",
    "spark.sql.streaming.minBatchesToRetain": "20",
    # hotswap needs neither pandas nor pyarrow; plain Python UDFs (in user .py queries) stay plain.
    "spark.sql.execution.pythonUDF.arrow.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    # A larger thread stack: Spark matches long Python tracebacks (a foreachBatch interrupted by
    # stop()) with a recursive regex that overflows the default 1 MB stack.
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -Xss16m",
}


def build_spark_session(settings: Settings, jars: list[Path]) -> SparkSession:
    # Without these, Python workers fail to connect back to the driver (docs/architecture.md, "Known traps").
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(settings.spark_master).appName(f"hotswap-{settings.namespace}")
    conf = {**_DEFAULT_CONF, "spark.driver.memory": settings.spark_driver_memory}
    if jars:
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    conf.update(settings.spark_conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.spark_log_level.upper())
    return spark
