"""The operator's light commands (status, abort, rollback, submit, --help) never import pyspark or
py4j: they only talk to Redis, and must answer in well under a second. Checked in a fresh
interpreter, since this test session itself imports Spark through other tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Runs the commands against fakeredis, through the CLI exactly as an operator calls it, then
# reports which Spark modules the interpreter has loaded.
SCRIPT = """
import json, sys
import fakeredis
from typer.testing import CliRunner

from hotswap.contract.journal import Journal, SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.models import QueryKind, QuerySource
from hotswap.executor.operator import cli, client

server = fakeredis.FakeServer()
client.redis_client = lambda settings, retries=40: fakeredis.FakeRedis(server=server)
Journal(fakeredis.FakeRedis(server=server), Keys("light")).create(
    SwapRecord(id="s1", to_query="q", source=QuerySource(name="q", kind=QueryKind.SQL, text="select 1"))
)
runner = CliRunner()
codes = {}
for args in (
    ["--help"],
    ["status", "--help"],
    ["-n", "light", "status"],
    ["-n", "light", "status", "--json"],
    ["-n", "light", "abort", "s1"],
    ["-n", "light", "rollback", "s1"],
    ["-n", "light", "submit", sys.argv[1]],
):
    codes[" ".join(args)] = runner.invoke(cli.app, args).exit_code
spark = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j"))
print(json.dumps({"codes": codes, "spark": spark}))
"""


def test_status_abort_rollback_and_submit_do_not_import_spark(tmp_path: Path) -> None:
    query = tmp_path / "q.sql"
    query.write_text("SELECT key FROM events", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOTSWAP_CONFIG_FILE": str(tmp_path / "none.toml")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(query)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["spark"] == [], f"a light command imported Spark: {report['spark'][:5]}"
    assert report["codes"] == {
        "--help": 0,
        "status --help": 0,
        "-n light status": 0,
        "-n light status --json": 0,
        "-n light abort s1": 0,
        "-n light rollback s1": 1,  # already aborted: one line, exit 1
        "-n light submit " + str(query): 1,  # no executor runs on the namespace
    }
