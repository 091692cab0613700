"""Installing hotswap adds one import package, `hotswap`, and the `hotswap` console script. Its rooms
are top-level folders of the checkout, mapped under `hotswap` by pyproject.toml (tests/layout.py):
the wheel built from this checkout and the editable install the tests run on import the same files
under the same names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.layout import REPO, found_packages, listed_packages, modules, package_dirs, rooms

ROOMS = ("contract", "executor", "service_graph", "execution_graph", "service_sink")


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


def test_the_rooms_are_the_top_level_folders_mapped_under_hotswap() -> None:
    assert package_dirs()["hotswap"] == REPO / "hotswap"
    assert rooms() == {room: REPO / room for room in ROOMS}


def test_pyproject_lists_every_package_of_the_checkout() -> None:
    # setuptools puts in the wheel only the packages listed: a subpackage added to a room is listed too.
    listed, found = set(listed_packages()), set(found_packages())
    assert found <= listed, f"list them in pyproject.toml, [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed <= found, f"pyproject.toml lists packages the checkout does not have: {sorted(listed - found)}"


def test_every_python_file_of_a_room_is_a_module_of_hotswap() -> None:
    # A folder without __init__.py would be left out of the wheel and unchecked by mypy.
    named = set(modules().values())
    for folder in package_dirs().values():
        for source in folder.rglob("*.py"):
            assert source in named, f"{source.relative_to(REPO)} is in no package of hotswap"


def test_the_package_tree_holds_no_links() -> None:
    for folder in package_dirs().values():
        links = [path for path in (folder, *folder.rglob("*")) if path.is_symlink()]
        assert links == [], f"links in the package tree: {links}"


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package_named_hotswap(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    packages = {name for name in top if not name.endswith((".dist-info", ".data"))}
    assert packages == {"hotswap"}


@pytest.mark.slow
def test_the_wheel_holds_the_checkouts_files_under_their_names(wheel: zipfile.ZipFile) -> None:
    files = {name: wheel.read(name) for name in wheel.namelist() if not name.split("/")[0].endswith(".dist-info")}
    in_wheel = {name.removesuffix("/__init__.py").removesuffix(".py").replace("/", "."): name for name in files}
    checkout = modules()
    assert sorted(in_wheel) == sorted(checkout)
    for module, path in checkout.items():
        assert files[in_wheel[module]] == path.read_bytes(), f"{module} differs from {path.relative_to(REPO)}"


@pytest.mark.slow
def test_the_installed_hotswap_imports_the_checkouts_files_under_their_names(tmp_path: Path) -> None:
    # The editable install, from a fresh interpreter outside the checkout: no sys.path entry of the
    # checkout helps it. find_spec runs no module but the packages' __init__.py.
    script = (
        "import importlib.util, json, sys\n"
        "print(json.dumps({name: importlib.util.find_spec(name).origin for name in json.loads(sys.argv[1])}))\n"
    )
    checkout = modules()
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, json.dumps(sorted(checkout))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    origins = {name: Path(origin).resolve() for name, origin in json.loads(done.stdout).items()}
    assert origins == checkout


@pytest.mark.slow
def test_the_console_script_is_hotswap(wheel: zipfile.ZipFile) -> None:
    entry_points = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "[console_scripts]" in text
    assert "hotswap = hotswap.executor.operator.cli:main" in text
