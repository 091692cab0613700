"""Installing hotswap adds one import package, `hotswap`, and the `hotswap` console script: the
wheel is built from this checkout and its top-level names are listed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("contract", "executor", "service_graph", "execution_graph", "service_sink")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools builds in <checkout>/build and keeps what it built there: a module deleted since
    # would still be in the wheel.
    shutil.rmtree(REPO / "build", ignore_errors=True)
    # No build isolation: the dev environment's setuptools builds it, with no download.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (built,) = out.glob("hotswap-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_one_top_level_package_named_hotswap(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    packages = {name for name in top if not name.endswith((".dist-info", ".data"))}
    assert packages == {"hotswap"}


def test_every_room_is_a_subpackage_with_every_module_of_its_folder(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for room in ROOMS:
        for source in (REPO / room).rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            assert f"hotswap/{source.relative_to(REPO)}" in names, f"{source} is missing from the wheel"


def test_the_console_script_is_hotswap(wheel: zipfile.ZipFile) -> None:
    entry_points = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "[console_scripts]" in text
    assert "hotswap = hotswap.executor.operator.cli:main" in text
