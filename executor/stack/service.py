"""What the embedded stack knows of each of its services, embedded or external."""

from __future__ import annotations

from pathlib import Path

from hotswap.contract.settings import StackSettings


class Service:
    """One service of the stack. Subclasses (KafkaBroker, RedisServer) say how it starts, where it
    answers and whether it answers; an external one (named in settings) is only ever asked the last."""

    name: str
    title: str
    env: str  # the setting that makes it external
    stop_grace_s: float

    def __init__(self, stack: StackSettings, home: Path, *, external: bool, ports: tuple[int, ...]) -> None:
        self.stack = stack
        self.dir = home / self.name
        self.external = external
        self.ports = ports  # every port the embedded service binds; clients use the first

    @property
    def port(self) -> int:
        return self.ports[0]

    def address(self) -> str:
        raise NotImplementedError

    def answers(self) -> bool:
        raise NotImplementedError
