"""The Redis ACL rules of hotswap's two users, from the keys and commands it uses (`hotswap acl`).

- The executor's user (and the operator's, for `status`, `diff` and the rest): every key of its
  namespace, and exactly the commands hotswap sends. Its fenced writes run as Lua scripts, and Redis
  checks the commands a script calls against the caller's rules too.
- A submitter's user: reads the whole namespace (for `status`), writes only the keys of operator
  requests and dry runs (contract.requests, contract.plans) and a shadow's last diff. It cannot
  write the journal, the lease, the routing plans or any graph record: the executor alone does.
"""

from __future__ import annotations

from hotswap.contract.names import Keys

# Every command hotswap sends to Redis, the scripts' included. CONFIG GET reads the persistence
# settings at start (executor.control.durability); SCAN is only for `hotswap run --reset-namespace`.
EXECUTOR_COMMANDS = (
    "hello", "ping", "select", "client|setname",
    "get", "set", "getdel", "del", "exists", "mget", "incr", "expire", "pexpire",
    "hget", "hset", "hdel", "hgetall", "hmget", "hincrby", "hexists",
    "lpush", "rpush", "rpop", "lrange", "lrem",
    "scan", "multi", "exec", "discard",
    "eval", "evalsha", "script|load",
    "config|get",
)  # fmt: skip

# A submitter reads what `status` reads (the journal through a read-only script), and leaves
# requests in one transaction. Redis checks a script's commands against these rules: its writes
# reach only the keys below.
SUBMITTER_COMMANDS = (
    "hello", "ping", "select", "client|setname",
    "get", "set", "del", "exists", "mget", "expire",
    "hget", "hgetall", "hmget", "hexists",
    "lpush", "lrange",
    "multi", "exec", "discard",
    "eval", "evalsha", "script|load",
)  # fmt: skip


def executor_rules(namespace: str) -> list[str]:
    """ACL SETUSER rules for the executor's user: its namespace's keys, hotswap's commands."""
    return [
        "resetkeys",
        f"~{Keys(namespace).prefix}:*",
        "resetchannels",
        "-@all",
        *(f"+{c}" for c in EXECUTOR_COMMANDS),
    ]


def submitter_rules(namespace: str) -> list[str]:
    """ACL SETUSER rules for a submitter: reads the namespace, writes requests and dry runs only."""
    prefix = Keys(namespace).prefix
    writes = (f"{prefix}:request*", f"{prefix}:dry-run*", f"{prefix}:shadow-diff:*")
    return [
        "resetkeys",
        f"%R~{prefix}:*",
        *(f"%RW~{pattern}" for pattern in writes),
        "resetchannels",
        "-@all",
        *(f"+{c}" for c in SUBMITTER_COMMANDS),
    ]


def acl_line(user: str, rules: list[str]) -> str:
    """One line of a Redis ACL file (`aclfile`) for `user`, its password left to fill in; `ACL SETUSER`
    takes the same words after the user name."""
    return " ".join(["user", user, "on", ">PASSWORD", *rules])
