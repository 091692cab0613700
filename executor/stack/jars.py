"""Jars from Maven Central: the embedded Kafka broker's, Spark's Kafka connector, and Hadoop's S3
client (for checkpoints on s3a://).

Both are resolved with Maven from the POMs in `compose/` into `settings.jar_cache` (`<home>/jars`
unless `HOTSWAP_JARS_DIR` says otherwise), once: a directory counts only once it holds the
`.complete` marker, written after every jar arrived. `hotswap stack fetch` fills both. The Spark
session uses the connector's jars when they are there (the offline option) and otherwise lets
Spark resolve the connector itself, so only the embedded broker needs Maven.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import structlog

from hotswap.executor.errors import StackError
from hotswap.executor.spark_connector import (
    COMPLETE_MARKER,
    CONNECTOR_ARTIFACTS,
    OBJECT_STORE_ARTIFACTS,
    connector_dir,
    hadoop_version,
    local_connector_jars,
    local_object_store_jars,
    object_store_dir,
    pyspark_version,
)
from hotswap.executor.stack.process import last_line, locked

log = structlog.get_logger(__name__)

COMPOSE_DIR = Path(__file__).resolve().parent.parent.parent / "compose"
KAFKA_POM_DIR = COMPOSE_DIR / "kafka"
CONNECTOR_POM_DIR = COMPOSE_DIR / "spark-connector"
OBJECT_STORE_POM_DIR = COMPOSE_DIR / "hadoop-aws"
# Sends the GCS mirror that Spark's parent POM lists to Maven Central (see the file).
MAVEN_SETTINGS = COMPOSE_DIR / "maven-settings.xml"
KAFKA_FALLBACK_VERSION = "4.1.1"
MAVEN_TIMEOUT_S = 900.0
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def kafka_jars(jar_cache: Path) -> Path:
    """The directory of the broker's jars, fetched from Maven Central on first use."""
    dest = jar_cache / f"kafka-{kafka_version()}"
    _fetch(KAFKA_POM_DIR, dest, [], "Kafka broker")
    return dest


def fetch_connector_jars(jar_cache: Path) -> list[Path]:
    """The paths of Spark's Kafka connector jars at the pyspark version, fetched on first use."""
    spark_version = pyspark_version()
    dest = connector_dir(jar_cache)
    if (dest / COMPLETE_MARKER).is_file() and local_connector_jars(jar_cache) is None:
        # Fetched by an earlier hotswap that needed fewer jars (before Avro): fetch again.
        log.info("stack.jars.refetching", what="Spark connector", dest=str(dest))
        shutil.rmtree(dest)
    extra = [f"-Dspark.version={spark_version}", "-DincludeArtifactIds=" + ",".join(CONNECTOR_ARTIFACTS)]
    _fetch(CONNECTOR_POM_DIR, dest, extra, "Spark Kafka connector")
    jars = local_connector_jars(jar_cache)
    if jars is None:
        raise StackError(f"{dest} lacks some of {', '.join(CONNECTOR_ARTIFACTS)}; delete it and retry to fetch again")
    return jars


def fetch_object_store_jars(jar_cache: Path) -> list[Path]:
    """Hadoop's S3 client's jars at the pyspark wheel's Hadoop version, fetched on first use."""
    dest = object_store_dir(jar_cache)
    _fetch(OBJECT_STORE_POM_DIR, dest, [f"-Dhadoop.version={hadoop_version()}"], "Hadoop S3 client")
    jars = local_object_store_jars(jar_cache)
    if jars is None:
        raise StackError(
            f"{dest} lacks some of {', '.join(OBJECT_STORE_ARTIFACTS)}; delete it and retry to fetch again"
        )
    return jars


def kafka_version() -> str:
    """The kafka_2.13 version pinned in compose/kafka/pom.xml."""
    try:
        root = ET.parse(KAFKA_POM_DIR / "pom.xml").getroot()  # noqa: S314 - our own pom, not untrusted input
    except (OSError, ET.ParseError):
        return KAFKA_FALLBACK_VERSION
    for dependency in root.iterfind("m:dependencies/m:dependency", _POM_NS):
        if dependency.findtext("m:artifactId", namespaces=_POM_NS) == "kafka_2.13":
            version = dependency.findtext("m:version", namespaces=_POM_NS)
            if version and not version.startswith("$"):
                return version.strip()
    return KAFKA_FALLBACK_VERSION


def _fetch(pom_dir: Path, dest: Path, extra_args: list[str], what: str) -> None:
    """Copy the runtime dependencies of `pom_dir/pom.xml` into `dest`, unless a complete copy is there."""
    if (dest / COMPLETE_MARKER).is_file():
        return
    if not (pom_dir / "pom.xml").is_file():
        raise StackError(f"{pom_dir / 'pom.xml'} is missing; run hotswap from a complete checkout")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            f"Maven (mvn) is needed to fetch the {what} jars and is not on PATH; "
            "install the Debian package maven (`make system-deps` does it)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(dest.parent / f".{dest.name}.lock"):
        if (dest / COMPLETE_MARKER).is_file():  # fetched by someone else while we waited
            return
        # Fetch into a private directory and rename it: `dest` is either complete or absent.
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        command = [
            mvn,
            "-q",
            "-B",
            "-gs",
            str(MAVEN_SETTINGS),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp}",
            "-DincludeScope=runtime",
            *extra_args,
        ]
        log.info("stack.jars.fetching", what=what, dest=str(dest))
        started = time.monotonic()
        try:
            result = subprocess.run(
                command, cwd=pom_dir, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StackError(
                f"fetching the {what} jars with Maven took over {MAVEN_TIMEOUT_S:.0f}s; "
                "check access to Maven Central and retry"
            ) from exc
        jars = sorted(p.name for p in tmp.glob("*.jar"))
        if result.returncode != 0 or not jars:
            shutil.rmtree(tmp, ignore_errors=True)
            detail = last_line(result.stdout + "\n" + result.stderr) or f"exit code {result.returncode}"
            raise StackError(
                f"fetching the {what} jars with Maven failed ({detail}); check access to Maven Central and retry"
            )
        (tmp / COMPLETE_MARKER).write_text("\n".join(jars) + "\n")
        shutil.rmtree(dest, ignore_errors=True)  # an incomplete leftover
        os.replace(tmp, dest)
        log.info("stack.jars.fetched", what=what, jars=len(jars), seconds=round(time.monotonic() - started, 1))
