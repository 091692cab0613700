"""Spark's Kafka connector: which jars it needs beyond the pyspark wheel, and where a fetch leaves
them. `hotswap run` (control/spark_session.py) uses local jars when they are complete, and the
embedded stack's `stack fetch` (stack/jars.py) puts them there."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import structlog

from hotswap.executor.errors import StackError

log = structlog.get_logger(__name__)

# The jars Spark's Kafka source and sink need beyond what the pyspark wheel ships, in this order.
CONNECTOR_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)
COMPLETE_MARKER = ".complete"  # written last by a fetch: a directory without it is unfinished


def local_connector_jars(jar_cache: Path) -> list[Path] | None:
    """The connector's jars if a complete fetch left all of them in `jar_cache`, else None. Never fetches."""
    dest = connector_dir(jar_cache)
    if not (dest / COMPLETE_MARKER).is_file():
        return None
    jars: list[Path] = []
    for artifact in CONNECTOR_ARTIFACTS:
        # "kafka-clients-3.9.1.jar", not "kafka-clients-test-...": a digit follows the artifact id.
        found = sorted(dest.glob(f"{artifact}-[0-9]*.jar"))
        if not found:
            log.warning("spark.connector.incomplete", dir=str(dest), missing=artifact)
            return None
        jars.append(found[-1])
    return jars


def connector_package() -> str:
    """Spark's Kafka connector as a Maven coordinate, at the pyspark version (its dependencies follow)."""
    return f"org.apache.spark:{CONNECTOR_ARTIFACTS[0]}:{pyspark_version()}"


def pyspark_version() -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError as exc:
        raise StackError("pyspark is not installed; run `make` to create the virtualenv") from exc


def connector_dir(jar_cache: Path) -> Path:
    return jar_cache / f"spark-connector-{pyspark_version()}"
