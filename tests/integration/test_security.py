"""Issue 4, security: Redis ACL users, and secrets kept out of output."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client, redis_client
from tests.integration.harness import run_cli

pytestmark = [pytest.mark.integration]


def test_a_redis_acl_user_works_and_its_password_never_shows(
    settings: Settings, control: redis.Redis, tmp_path: Path
) -> None:
    user, password = f"hs-{uuid.uuid4().hex[:6]}", f"pw-{uuid.uuid4().hex}"
    control.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"])
    try:
        address = settings.redis_dsn.split("://", 1)[1]
        secured = settings.model_copy(update={"redis_url": SecretStr(f"redis://{user}:{password}@{address}")})
        assert redis_client(secured).acl_whoami() == user
        assert Client(secured).status().current is None
        assert password not in repr(secured)
        status = run_cli(secured, "status", "--json")
        stack = run_cli(secured, "stack", "status")
    finally:
        control.acl_deluser(user)
    assert status.returncode == 0, status.stderr
    assert stack.returncode == 0, stack.stderr
    for output in (status.stdout, status.stderr, stack.stdout, stack.stderr):
        assert password not in output


def test_a_wrong_redis_password_is_a_one_line_error(settings: Settings) -> None:
    address = settings.redis_dsn.split("://", 1)[1]
    wrong = settings.model_copy(update={"redis_url": SecretStr(f"redis://nobody:wrong-secret@{address}")})
    result = run_cli(wrong, "status")
    assert result.returncode == 1
    assert "wrong-secret" not in result.stderr
    assert result.stderr.startswith("hotswap: Redis refused the credentials")
    assert len(result.stderr.strip().splitlines()) == 1
