"""The import graph of the checkout, drawn from its files (tests/layout.py; `python -m tests.layout`
prints it): the rooms and their arrows, which point one way, down to the contract
(docs/architecture.md, "The rooms")."""

from __future__ import annotations

import pytest

from tests.layout import arrows, floors, modules, room_of

ROOMS = {"contract", "executor", "service_graph", "execution_graph", "service_sink"}

# Every arrow between rooms, drawn here rather than read from the code, so that a new one is seen.
ARROWS = {
    "hotswap": {"executor"},  # hotswap/__main__.py: `python -m hotswap` is the CLI
    "executor": {"contract", "service_graph", "execution_graph", "service_sink"},
    "service_graph": {"contract"},
    "execution_graph": {"contract"},
    "service_sink": {"contract"},
    "contract": set(),
}


def executor_part(module: str) -> str:
    """The executor's parts (executor.control, executor.operator, executor.errors, ...); other rooms whole."""
    parts = module.split(".")
    return ".".join(parts[1:3]) if room_of(module) == "executor" else room_of(module)


def test_the_graph_shows_every_room_with_its_modules() -> None:
    graph = arrows()
    assert set(graph) == ROOMS | {"hotswap"}
    for room in ROOMS:
        assert any(room_of(module) == room for module in modules()), f"no module found in {room}/"


def test_the_rooms_have_exactly_the_drawn_arrows() -> None:
    assert arrows() == ARROWS


def test_the_contract_imports_no_other_room() -> None:
    assert arrows()["contract"] == set()


def test_the_arrows_point_one_way_down_to_the_contract() -> None:
    assert floors(arrows()) == [
        ["contract"],
        ["execution_graph", "service_graph", "service_sink"],
        ["executor"],
        ["hotswap"],
    ]


def test_the_executors_parts_import_each_other_in_no_circle() -> None:
    graph = arrows(executor_part)
    assert {"executor.control", "executor.operator", "executor.stack", "executor.tools"} <= set(graph)
    floors(graph)  # raises on a circle


def test_a_circle_is_found() -> None:
    with pytest.raises(ValueError, match=r"a circle among \['a', 'b'\]"):
        floors({"a": {"b"}, "b": {"a"}, "c": {"a"}})
