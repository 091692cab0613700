"""The embedded Redis server, with append-only persistence under `<home>/redis/`."""

from __future__ import annotations

from pathlib import Path

import redis
import structlog

from hotswap.contract.settings import StackSettings
from hotswap.executor.stack.process import LOCALHOST, Proc, port_open, rotate, spawn
from hotswap.executor.stack.service import Service

log = structlog.get_logger(__name__)


def redis_answers(url: str) -> bool:
    """True if the Redis at `url` answers PING within a couple of seconds."""
    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class RedisServer(Service):
    """The embedded Redis, or the external one that settings name (then only `answers` is used)."""

    name = "redis"
    title = "Redis"
    env = "HOTSWAP_REDIS_URL"
    stop_grace_s = 10.0

    def __init__(self, stack: StackSettings, home: Path) -> None:
        super().__init__(stack, home, external=stack.redis_url is not None, ports=(stack.redis_port,))

    def address(self) -> str:
        """Where Redis is, with any password masked: this is printed and logged."""
        return mask_url(self.stack.redis_dsn)

    def answers(self) -> bool:
        """True if Redis answers PING within a couple of seconds."""
        if not self.external and not port_open(self.port):
            return False
        return redis_answers(self.stack.redis_dsn)

    def start(self, redis_server: str) -> Proc:
        """Start `redis_server` detached on the embedded port."""
        self.dir.mkdir(parents=True, exist_ok=True)
        logfile = self.dir / "redis.log"
        rotate(logfile)
        port = str(self.port)
        command = [
            redis_server,
            "--port",
            port,
            "--bind",
            LOCALHOST,
            "--appendonly",
            "yes",
            # The control plane writes little, and a recorded cut must survive a crash of Redis too.
            "--appendfsync",
            "always",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--save",
            "",
            "--pidfile",
            str(self.dir / "redis.pid"),
            "--logfile",
            "",
        ]
        log.info("stack.redis.starting", port=self.port, log=str(logfile))
        # Redis rewrites its process title to "redis-server 127.0.0.1:<port>".
        return spawn(self.title, command, logfile, self.dir, ("redis-server", port))


def mask_url(url: str) -> str:
    """The URL with whatever sits before '@' in its authority masked (a password, or a lone token)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    credentials, host = authority.rsplit("@", 1)
    user, colon, _ = credentials.partition(":")
    masked = f"{user}:***" if colon else "***"
    return f"{scheme}://{masked}@{host}{slash}{path}"
