"""Every error one line: each CLI command, given bad input, prints `hotswap: <reason>` on one line and
exits 1, or is a usage error (exit 2); never a traceback. Redis is a fake, or a port nothing listens
on; no Spark, no Kafka."""

from __future__ import annotations

import os
from pathlib import Path

import fakeredis
import pytest
from typer.testing import CliRunner

from hotswap.contract.journal import Journal, SwapRecord
from hotswap.contract.names import Keys
from hotswap.executor.operator import cli, client

NS = "bad-input"
WINDOWED = (
    "SELECT window.start AS window_start, window.end AS window_end, key, count(*) AS n FROM events "
    "GROUP BY window(event_time, '10 seconds'), key"
)


@pytest.fixture
def redis_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> fakeredis.FakeServer:
    """A namespace with one ended swap, and no executor (no lease)."""
    server = fakeredis.FakeServer()
    monkeypatch.setattr(client, "redis_client", lambda *args, **kwargs: fakeredis.FakeRedis(server=server))
    monkeypatch.setattr(cli, "configure_logging", lambda *args, **kwargs: None)
    for name in list(os.environ):
        if name.startswith("HOTSWAP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOTSWAP_CONFIG_FILE", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("HOTSWAP_HOME", str(tmp_path / "home"))
    Journal(fakeredis.FakeRedis(server=server), Keys(NS)).create(SwapRecord(id="s1", to_query="b"))
    return server


def files(tmp_path: Path) -> dict[str, Path]:
    made = {
        "good.sql": WINDOWED,
        "query.txt": WINDOWED,
        "empty.sql": "   \n",
        "huge.sql": WINDOWED + " -- " + "x" * 300_000,
        "bad.toml": "namespace = [unclosed",
        "broken.avsc": "{not json",
    }
    paths = {}
    for name, text in made.items():
        paths[name] = tmp_path / name
        paths[name].write_text(text)
    paths["latin1.sql"] = tmp_path / "latin1.sql"
    paths["latin1.sql"].write_bytes(b"SELECT 'caf\xe9' AS x")
    paths["missing.sql"] = tmp_path / "missing.sql"
    paths["a directory.sql"] = tmp_path / "a directory.sql"
    paths["a directory.sql"].mkdir()
    return paths


# (arguments, extra environment, what the one line must say); {name} is a file of `files`.
CASES: list[tuple[list[str], dict[str, str], str]] = [
    (["replace", "{missing.sql}"], {}, "does not exist"),
    (["replace", "{good.sql}"], {}, "no query serves the namespace"),
    (["submit", "{missing.sql}"], {}, "does not exist"),
    (["submit", "{query.txt}"], {}, "must end in .sql or .py"),
    (["submit", "{empty.sql}"], {}, "is empty"),
    (["submit", "{latin1.sql}"], {}, "is not UTF-8 text"),
    (["submit", "{huge.sql}"], {}, "at most 262,144"),
    (["submit", "{a directory.sql}"], {}, ""),
    (["submit", "{good.sql}", "--name", "a b"], {}, "--name"),
    (["submit", "{good.sql}"], {}, "no executor is running"),
    (["submit", "{good.sql}", "--dry-run"], {}, "no executor is running"),
    (["submit", "{good.sql}", "--avro-schema", "{missing.sql}"], {}, ""),
    (["submit", "{good.sql}", "--fix", "nope"], {}, "nope"),
    (["submit", "{good.sql}", "--wait", "--timeout", "-5"], {}, ""),
    (["abort", "nope"], {}, "nope"),
    (["rollback", "nope"], {}, "nope"),
    (["promote", "nope"], {}, "nope"),
    (["promote", "s1"], {}, "s1"),
    (["diff", "nope"], {}, "nope"),
    (["diff", "s1"], {}, "s1"),
    (["history", "--limit", "0"], {}, ""),
    (["status", "--bogus"], {}, ""),
    (["status"], {"HOTSWAP_WINDOW": "soon"}, "invalid settings"),
    (["status"], {"HOTSWAP_REDIS_URL": "127.0.0.1:6379"}, "redis://"),
    (["status"], {"HOTSWAP_QUERY_KINDS": "sql,scala"}, "invalid settings"),
    (["status"], {"HOTSWAP_STATIC_TABLES": "not json"}, "invalid settings"),
    (["status"], {"HOTSWAP_CONFIG_FILE": "{bad.toml}"}, ""),
    (["status", "--namespace", "has.dot"], {}, "invalid settings"),
    (["run", "--query", "{missing.sql}"], {}, "does not exist"),
    (["run", "--query", "{good.sql}", "--window", "soon"], {}, ""),
    (["run", "--query", "{good.sql}", "--graph-partitions", "0"], {}, ""),
    (["run", "--query", "{good.sql}", "--spark-remote", "sc://localhost:15002"], {}, "Spark Connect"),
    (["run", "--query", "{query.txt}"], {}, "must end in .sql or .py"),
    (["stack", "bogus"], {}, ""),
    (["generate", "--rate", "-1"], {}, ""),
]


def case_id(case: list[str] | dict[str, str] | str) -> str:
    if isinstance(case, list):
        return " ".join(case)
    if isinstance(case, dict):
        return ",".join(f"{k}={v}" for k, v in case.items())
    return ""


@pytest.mark.parametrize(("args", "env", "says"), CASES, ids=case_id)
def test_bad_input_is_one_line_and_never_a_traceback(
    redis_server: fakeredis.FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    says: str,
) -> None:
    paths = {f"{{{name}}}": str(path) for name, path in files(tmp_path).items()}
    argv = [paths.get(arg, arg) for arg in args]
    for name, value in env.items():
        monkeypatch.setenv(name, paths.get(value, value))
    result = CliRunner().invoke(cli.app, ["--namespace", NS, *argv] if argv[0] != "stack" else argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{argv}: {type(result.exception).__name__}: {result.exception}"
    )
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code in (1, 2), (argv, result.exit_code, result.stdout, result.stderr)
    if result.exit_code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (argv, result.stderr)
        assert lines[0].startswith("hotswap: "), (argv, result.stderr)
        assert says in lines[0], (argv, lines[0])


def test_the_table_covers_every_command_with_at_least_25_cases() -> None:
    assert len(CASES) >= 25
    covered = {args[0] for args, _, _ in CASES}
    assert covered >= {"run", "submit", "status", "abort", "rollback", "promote", "diff", "history", "stack"}
