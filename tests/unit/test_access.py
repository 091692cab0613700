"""`hotswap acl`: the Redis ACL lines of the executor's user and a submitter's."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from hotswap.contract.access import acl_line, executor_rules, submitter_rules
from hotswap.executor.operator import cli


def test_acl_prints_one_line_per_user_confined_to_the_namespace() -> None:
    result = CliRunner().invoke(cli.app, ["--namespace", "prod", "acl", "--submitter-user", "alice"])
    assert result.exit_code == 0, result.output
    executor, submitter = result.stdout.strip().splitlines()
    assert executor.startswith("user hotswap on >PASSWORD resetkeys ~hotswap:{prod}:* ")
    assert submitter.startswith("user alice on >PASSWORD resetkeys %R~hotswap:{prod}:* ")
    assert "+config|get" in executor.split()


def test_a_submitter_writes_only_requests_dry_runs_and_diffs() -> None:
    writes = [rule for rule in submitter_rules("ns") if rule.startswith(("%W", "%RW", "~"))]
    assert writes == ["%RW~hotswap:{ns}:request*", "%RW~hotswap:{ns}:dry-run*", "%RW~hotswap:{ns}:shadow-diff:*"]
    assert "-@all" in submitter_rules("ns")
    assert "+rpush" not in submitter_rules("ns")  # the journal's lists grow by the executor's hand only
    assert "~hotswap:{ns}:*" in executor_rules("ns")


def test_the_acl_lines_the_docs_show_are_the_ones_hotswap_prints() -> None:
    root = Path(__file__).resolve().parents[2]
    lines = [acl_line("hotswap", executor_rules("prod")), acl_line("hotswap-submit", submitter_rules("prod"))]
    for doc in (root / "README.md", root / "docs" / "security.md"):
        text = doc.read_text()
        for line in lines:
            assert line in text, f"{doc.name} shows other ACL lines than `hotswap -n prod acl` prints"
