"""The container images run the versions the project runs: the same broker as the embedded stack,
and the executor image's pinned packages satisfy pyproject.toml."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hotswap.executor.stack.jars import kafka_version
from tests.integration.containers import image_versions

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose"


def pinned_executor_packages() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (COMPOSE / "executor" / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_the_kafka_image_runs_the_embedded_stacks_broker_version() -> None:
    versions = image_versions()
    assert versions["KAFKA_VERSION"] == kafka_version()
    assert versions["KAFKA_OFFICIAL_IMAGE"] == f"apache/kafka:{kafka_version()}"
    assert versions["REDIS_OFFICIAL_IMAGE"].startswith(f"redis:{versions['REDIS_VERSION']}-")
    assert versions["REDIS_DEB"].startswith(f"5:{versions['REDIS_VERSION']}-")


def test_the_executor_image_pins_every_dependency_of_hotswap_within_its_bounds() -> None:
    pins = pinned_executor_packages()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert image_versions()["HOTSWAP_VERSION"] == project["version"]
    for dependency in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dependency.name)
        assert name in pins, f"compose/executor/requirements.txt lacks {dependency.name}"
        assert dependency.specifier.contains(pins[name]), f"{name}=={pins[name]} does not satisfy {dependency}"
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", version) for version in pins.values())


def test_kafka_variables_become_broker_settings_as_in_the_official_image(tmp_path: Path) -> None:
    # The conversion loop of compose/kafka/run, run alone: the image's file is written in /var/lib.
    script = (COMPOSE / "kafka" / "run").read_text()
    loop = script[script.index("  for name in") : script.index("} >")]
    env = {"PATH": os.environ["PATH"], "KAFKA_LOG_DIRS": "/data", "KAFKA_SASL_ENABLED__MECHANISMS": "PLAIN"}
    env |= {"KAFKA_A___B": "1", "KAFKA_HEAP_OPTS": "-Xmx1g"}
    out = subprocess.run(["bash", "-c", loop], env=env, capture_output=True, text=True, check=True).stdout
    assert sorted(out.splitlines()) == ["a_b=1", "log.dirs=/data", "sasl.enabled-mechanisms=PLAIN"]
