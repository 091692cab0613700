"""Component tests: the control plane's real code on fakeredis, with an injected clock."""

from __future__ import annotations

import pytest

from hotswap.contract.settings import Settings
from tests.component.fakes import World


@pytest.fixture
def settings() -> Settings:
    return Settings(namespace="component", query_restarts=2, query_restart_backoff="2s", cut_timeout="300s")


@pytest.fixture
def world(settings: Settings) -> World:
    """A namespace serving query `a` (10 s windows), with no swap yet."""
    world = World(settings)
    world.serve("a", 10_000)
    return world
