"""Spark's Kafka connector and Avro support: which jars they need beyond the pyspark wheel, and where
a fetch leaves them. `hotswap run` (control/spark_session.py) uses local jars when they are complete,
and the embedded stack's `stack fetch` (stack/jars.py) puts them there."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import structlog

from hotswap.executor.errors import StackError

log = structlog.get_logger(__name__)

# Delta Lake for Spark 4.2 (the delta sink): the newest release on Maven Central for it (4.4.1 is on
# PyPI but not on Maven Central on 2026-11-26). Pinned also in compose/spark-connector/pom.xml.
DELTA_VERSION = "4.4.0"
DELTA_SPARK = "delta-spark_4.2_2.13"
# The jars Spark's Kafka source and sink and its Avro functions need beyond what the pyspark wheel
# ships, in this order.
CONNECTOR_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
    "spark-avro_2.13",
    DELTA_SPARK,
    "delta-storage",
)
# spark-avro at the pyspark version (4.2.0) is not on Maven Central (404 on 2026-11-24, while
# spark-sql-kafka 4.2.0 is): the newest release there, 4.1.1, is used instead. Its from_avro and
# to_avro run on Spark 4.2.0 (tests/integration/test_sources.py reads Avro through it). Pinned also
# in compose/spark-connector/pom.xml.
AVRO_VERSION = "4.1.1"
COMPLETE_MARKER = ".complete"  # written last by a fetch: a directory without it is unfinished
# Hadoop's S3 client, for a checkpoint root on s3a://: hadoop-aws at the version of the Hadoop client
# the pyspark wheel ships, with the AWS SDK bundle (about 690 MB) and the stream reader it declares.
# Loaded only by a session whose checkpoints are on an object store. Fetched with compose/hadoop-aws/pom.xml.
OBJECT_STORE_ARTIFACTS = ("hadoop-aws", "bundle", "analyticsaccelerator-s3")


def local_connector_jars(jar_cache: Path) -> list[Path] | None:
    """The connector's jars if a complete fetch left all of them in `jar_cache`, else None. Never fetches."""
    return _complete(connector_dir(jar_cache), CONNECTOR_ARTIFACTS)


def local_object_store_jars(jar_cache: Path) -> list[Path] | None:
    """Hadoop's S3 client's jars if a complete fetch left them in `jar_cache`, else None. Never fetches."""
    return _complete(object_store_dir(jar_cache), OBJECT_STORE_ARTIFACTS)


def _complete(dest: Path, artifacts: tuple[str, ...]) -> list[Path] | None:
    if not (dest / COMPLETE_MARKER).is_file():
        return None
    jars: list[Path] = []
    for artifact in artifacts:
        # "kafka-clients-3.9.1.jar", not "kafka-clients-test-...": a digit follows the artifact id.
        found = sorted(dest.glob(f"{artifact}-[0-9]*.jar"))
        if not found:
            log.warning("spark.connector.incomplete", dir=str(dest), missing=artifact)
            return None
        jars.append(found[-1])
    return jars


def connector_package() -> str:
    """Spark's Kafka connector and Avro support as Maven coordinates for spark.jars.packages (their
    dependencies follow)."""
    return (
        f"org.apache.spark:{CONNECTOR_ARTIFACTS[0]}:{pyspark_version()},org.apache.spark:spark-avro_2.13:{AVRO_VERSION},"
        f"io.delta:{DELTA_SPARK}:{DELTA_VERSION}"
    )


def object_store_package() -> str:
    """Hadoop's S3 client as Maven coordinates for spark.jars.packages (the AWS SDK follows)."""
    return f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"


def hadoop_version() -> str:
    """The version of the Hadoop client in the pyspark wheel (hadoop-aws must match it exactly)."""
    from pyspark.find_spark_home import _find_spark_home

    found = sorted(Path(_find_spark_home(), "jars").glob("hadoop-client-api-[0-9]*.jar"))
    if not found:
        raise StackError("the pyspark installation has no hadoop-client-api jar; reinstall pyspark (`make`)")
    return found[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def object_store_dir(jar_cache: Path) -> Path:
    return jar_cache / f"hadoop-aws-{hadoop_version()}"


def pyspark_version() -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError as exc:
        raise StackError("pyspark is not installed; run `make` to create the virtualenv") from exc


def connector_dir(jar_cache: Path) -> Path:
    return jar_cache / f"spark-connector-{pyspark_version()}"
