"""Where each module of the checkout lives, under the name it installs as.

pyproject.toml maps the one import package, `hotswap`, onto the checkout's folders
(`[tool.setuptools.package-dir]`): `hotswap` is hotswap/, `hotswap.executor` is executor/,
`hotswap.contract` is contract/, and so on. The wheel and an editable install read that mapping; so
do the type check (tests/typecheck.py), the packaging tests and the import graph's test, from here.

`python -m tests.layout` prints the rooms, each with its folder and the rooms it imports, drawn from
the checkout's files.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Callable, Collection
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


def imported(module: str, path: Path, known: Collection[str]) -> set[str]:
    """The modules of hotswap that a module imports, by name, relative imports resolved: for
    `from package import name`, the submodule when `name` is one of `known`, else the package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name == "hotswap" or name.startswith("hotswap.")}


def room_of(module: str) -> str:
    """The room a module of hotswap is in (`executor` for hotswap.executor.control.swap); `hotswap`
    for the namespace's own modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in rooms() else "hotswap"


def arrows(unit: Callable[[str], str] = room_of) -> dict[str, set[str]]:
    """The import graph of the checkout, between units (rooms by default): an arrow A -> B where a
    module of A imports one of B. Every unit is a key, with no arrow to itself."""
    graph: dict[str, set[str]] = {}
    known = modules()
    for module, path in known.items():
        graph.setdefault(unit(module), set())
        for target in imported(module, path, known):
            graph.setdefault(unit(target), set())
            if unit(target) != unit(module):
                graph[unit(module)].add(unit(target))
    return graph


def floors(graph: dict[str, set[str]]) -> list[list[str]]:
    """The units from the ground up: each stands above everything it imports. Raises ValueError
    naming the units of a circle, which stand on no floor."""
    placed: dict[str, int] = {}
    while len(placed) < len(graph):
        ready = [unit for unit in graph if unit not in placed and graph[unit] <= placed.keys()]
        if not ready:
            # Leave out what only stands on a circle: what remains is in one, or between two.
            left = {unit: graph[unit] - placed.keys() for unit in graph if unit not in placed}
            while above := {unit for unit in left if not any(unit in targets for targets in left.values())}:
                left = {unit: targets for unit, targets in left.items() if unit not in above}
            raise ValueError(f"a circle among {sorted(left)}")
        for unit in ready:
            placed[unit] = 1 + max((placed[target] for target in graph[unit]), default=0)
    return [sorted(u for u, floor in placed.items() if floor == level) for level in range(1, max(placed.values()) + 1)]


def main() -> None:
    graph = arrows()
    folders = {"hotswap": package_dirs()["hotswap"], **rooms()}
    for level, units in reversed(list(enumerate(floors(graph), start=1))):
        for unit in units:
            targets = ", ".join(sorted(graph[unit])) or "nothing"
            folder = f"{folders[unit].relative_to(REPO)}/"
            print(f"floor {level}  {unit:<16} {folder:<17} imports {targets}")


if __name__ == "__main__":
    main()
