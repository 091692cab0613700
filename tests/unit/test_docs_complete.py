"""The documentation names everything a user can type or read: every option of every command, every
setting as its environment variable and every reason code appears in README.md or in docs/*.md."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer

from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.executor.operator.cli import app

ROOT = Path(__file__).resolve().parents[2]

# Settings documented under another name, or not for users. Empty today: every field is documented
# as HOTSWAP_<FIELD> (the SASL username and password in docs/security.md, "Connections").
UNDOCUMENTED_SETTINGS: frozenset[str] = frozenset()


@cache
def documentation() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def mentioned(word: str) -> bool:
    """`word` appears whole: `--name` is not found in `--namespace`, nor HOTSWAP_EVENT_TIME in ..._UNIT."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", documentation()) is not None


def commands(command: Any, path: tuple[str, ...] = ("hotswap",)) -> Iterator[tuple[str, Any]]:
    """Every command and sub-command, by its path. Typer may bring its own copy of click, so groups and
    options are recognised by what they have (`commands`, `param_type_name`), not by their class."""
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def long_options(command: Any) -> Iterator[str]:
    for param in command.params:
        if param.param_type_name == "option":
            yield from (opt for opt in [*param.opts, *param.secondary_opts] if opt.startswith("--") and opt != "--help")


COMMANDS = dict(commands(typer.main.get_command(app)))
CLI_OPTIONS = sorted({(path, opt) for path, command in COMMANDS.items() for opt in long_options(command)})
ENV_PREFIX = str(Settings.model_config.get("env_prefix", "")).upper()
SETTINGS = sorted(f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields if name not in UNDOCUMENTED_SETTINGS)


def test_the_walk_reaches_every_command() -> None:
    assert {"hotswap", "hotswap run", "hotswap submit", "hotswap stack", "hotswap stack up"} <= set(COMMANDS)
    assert ("hotswap run", "--query") in CLI_OPTIONS
    assert ENV_PREFIX == "HOTSWAP_"
    assert not UNDOCUMENTED_SETTINGS - set(Settings.model_fields), "an exception names a setting that is gone"


@pytest.mark.parametrize(("command", "option"), CLI_OPTIONS, ids=[f"{c} {o}" for c, o in CLI_OPTIONS])
def test_every_option_is_documented(command: str, option: str) -> None:
    assert mentioned(option), f"`{command} {option}` is in no README.md or docs/*.md"


@pytest.mark.parametrize("env", SETTINGS)
def test_every_setting_is_documented(env: str) -> None:
    assert mentioned(env), f"{env} is in no README.md or docs/*.md (docs/reference.md, the settings table)"


@pytest.mark.parametrize("code", [code.value for code in ReasonCode])
def test_every_reason_code_is_documented(code: str) -> None:
    assert f"`{code}`" in documentation(), f"`{code}` is in no README.md or docs/*.md (docs/reference.md)"
