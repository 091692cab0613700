"""Where each module of the checkout lives, under the name it installs as.

pyproject.toml maps the one import package, `hotswap`, onto the checkout's folders
(`[tool.setuptools.package-dir]`): `hotswap` is hotswap/, `hotswap.executor` is executor/,
`hotswap.contract` is contract/, and so on. The wheel and an editable install read that mapping; so
do the type check (tests/typecheck.py) and the packaging tests, from here.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@cache
def _setuptools() -> dict[str, Any]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    config: dict[str, Any] = pyproject["tool"]["setuptools"]
    return config


def package_dirs() -> dict[str, Path]:
    """pyproject.toml's mapping: each mapped package's name and its folder."""
    return {name: REPO / folder for name, folder in _setuptools()["package-dir"].items()}


def rooms() -> dict[str, Path]:
    """The rooms: the packages mapped directly under `hotswap`, by their short name (`executor`)."""
    return {name.removeprefix("hotswap."): folder for name, folder in package_dirs().items() if name != "hotswap"}


def listed_packages() -> list[str]:
    """The packages pyproject.toml lists: what the wheel holds."""
    return [str(name) for name in _setuptools()["packages"]]


def found_packages() -> dict[str, Path]:
    """Every package of the checkout under its installed name: each mapped folder, and every folder
    with an __init__.py below it."""
    found: dict[str, Path] = {}
    for name, folder in package_dirs().items():
        for init in sorted(folder.rglob("__init__.py")):
            found[".".join((name, *init.parent.relative_to(folder).parts))] = init.parent
    return found


def modules() -> dict[str, Path]:
    """Every module of the checkout under its installed name (`hotswap.executor.control.swap`:
    executor/control/swap.py). A package is its __init__.py."""
    found: dict[str, Path] = {}
    for package, folder in found_packages().items():
        for source in sorted(folder.glob("*.py")):
            found[package if source.stem == "__init__" else f"{package}.{source.stem}"] = source
    return found
