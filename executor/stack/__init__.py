"""The embedded stack: a KRaft Kafka broker (or a cluster of `kafka_brokers` of them) and a Redis
server, run as plain processes.

`hotswap stack up|down|status`, the tests and the demo use it. Everything it writes lives under
`settings.home`: the fetched jars (`jars/`), the broker's config, data and log (`kafka/`, or
`kafka-cluster/node-<id>/` per node of a cluster), Redis's
append-only file and log (`redis/`), and `stack.json`, the pids of the processes it started.

Services named in settings (`kafka_bootstrap`, `redis_url`) are external: the stack never starts
or stops them, it only reports whether they answer. A healthy service already listening on one of
the embedded ports (say, a stack started by another checkout) is used as it is, never duplicated.

Modules, by service: `embedded` (the `EmbeddedStack` facade), `kafka` (the broker's config,
storage format, start and health), `redis` (start and health), `jars` (the broker's and Spark's
Kafka connector jars, resolved with Maven from `compose/`) and `process` (spawning, recognising,
stopping the processes, and the state file that remembers them).
"""

from hotswap.executor.stack.embedded import EmbeddedStack, ServiceStatus
from hotswap.executor.stack.kafka import kafka_answers
from hotswap.executor.stack.redis import redis_answers

__all__ = ["EmbeddedStack", "ServiceStatus", "kafka_answers", "redis_answers"]
