"""Settings: one frozen model read from HOTSWAP_* environment variables, an optional TOML file,
and CLI flags on top (passed in as keyword arguments), in that order of precedence; and its slices,
the settings of one concern each (StackSettings, PipelineSettings, ...), which every class but the
composition root takes instead of the whole."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from hotswap.contract.durations import Duration, OffOrDuration
from hotswap.contract.errors import ConfigError
from hotswap.contract.models import GraphEngine, QueryKind
from hotswap.contract.names import Names
from hotswap.contract.sink import SinkKind, SinkSpec
from hotswap.contract.source import (
    DEFAULT_EVENT_TIME,
    DEFAULT_SCHEMA,
    AvroWire,
    EpochUnit,
    SourceFormat,
    SourceSpec,
)

DEFAULT_CONFIG_FILE = Path("hotswap.toml")


class StaticTable(BaseModel):
    """A table submitted queries may read besides `events`, for lookups: files Spark reads as `format`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    format: Literal["parquet", "json", "csv", "orc", "avro", "text"] = "parquet"


# -- Slices: the settings by concern ------------------------------------------------------------
# `Settings` is read once, whole, by the composition root (the CLI and the Executor it builds); every
# other class takes only the slice (or slices) of its concern. A slice is a frozen copy of some of
# Settings' fields, under the same names, plus the values derived from them (`names`, `bootstrap`,
# ...), which are no Settings fields. Every Settings field is in exactly one slice
# (tests/unit/test_settings.py); the environment variables and TOML keys are Settings' own.


class _Slice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


_S = TypeVar("_S", bound=_Slice)


class StackSettings(_Slice):
    """The local stack: hotswap's home, the jars, and the embedded Kafka and Redis (or the existing
    services that replace them)."""

    home: Path
    jars_dir: Path | None
    kafka_bootstrap: str | None
    redis_url: SecretStr | None
    kafka_brokers: int
    kafka_port: int
    kafka_controller_port: int
    kafka_heap: str
    redis_port: int
    stack_postgres: bool
    postgres_port: int

    @property
    def jar_cache(self) -> Path:
        return (self.jars_dir or self.home / "jars").resolve()

    @property
    def embedded_kafka_ports(self) -> tuple[int, ...]:
        """The client ports of the embedded brokers, node 1 first."""
        return tuple(self.kafka_port + i for i in range(self.kafka_brokers))

    @property
    def embedded_controller_ports(self) -> tuple[int, ...]:
        """The KRaft controller ports of the embedded brokers, node 1 first."""
        return tuple(self.kafka_controller_port + i for i in range(self.kafka_brokers))

    @property
    def bootstrap(self) -> str:
        # Every embedded broker: a client must find the cluster while any one of them is down.
        return self.kafka_bootstrap or ",".join(f"127.0.0.1:{port}" for port in self.embedded_kafka_ports)

    @property
    def redis_dsn(self) -> str:
        if self.redis_url is not None:
            return self.redis_url.get_secret_value()
        return f"redis://127.0.0.1:{self.redis_port}/0"


# The Kafka client's defaults (16 KiB batches, sent at once) make Spark's sink send many small
# requests: routing 200,000 events to a graph topic took 2.49 s with them and 1.96 s with these, as
# fast as routing to no sink at all (docs/performance.md, "Producer batches"). 5 ms is far below a
# micro-batch; 256 KiB per partition is bounded by the producer's 32 MiB buffer.
SINK_PRODUCER_OPTIONS = {
    "kafka.linger.ms": "5",
    "kafka.batch.size": str(256 * 1024),
    # The client's default, said: a producer's retry never writes a row twice (contract/rewrites.py
    # counts on it), and a setting that would turn it off fails instead of doing so quietly.
    "kafka.enable.idempotence": "true",
}


RECONNECT_BACKOFF_MAX_MS = 1000


class KafkaSettings(_Slice):
    """How a Kafka client (kafka-python's, or Spark's connector) reaches the brokers."""

    bootstrap: str  # derived: kafka_bootstrap, or every embedded broker
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
    kafka_sasl_mechanism: str | None
    kafka_sasl_username: str | None
    kafka_sasl_password: SecretStr | None
    kafka_ssl_cafile: Path | None

    def kafka_python_config(self) -> dict[str, Any]:
        """Client settings for kafka-python (producers, consumers, admin)."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap.split(","),
            "security_protocol": self.kafka_security_protocol,
            # kafka-python waits up to 30 s between attempts to reach a broker that kept refusing
            # (Java's client: 1 s): after an outage, one client then said "NodeNotReadyError" for
            # many seconds while the others were already back, and a swap waited on it.
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        }
        if self.kafka_sasl_mechanism:
            config["sasl_mechanism"] = self.kafka_sasl_mechanism
            config["sasl_plain_username"] = self.kafka_sasl_username
            if self.kafka_sasl_password is not None:
                config["sasl_plain_password"] = self.kafka_sasl_password.get_secret_value()
        if self.kafka_ssl_cafile:
            config["ssl_cafile"] = str(self.kafka_ssl_cafile)
        return config

    def spark_kafka_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source and sink (`kafka.`-prefixed client properties)."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap,
            "kafka.security.protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            options["kafka.sasl.mechanism"] = self.kafka_sasl_mechanism
            password = self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else ""
            module = (
                "org.apache.kafka.common.security.scram.ScramLoginModule"
                if self.kafka_sasl_mechanism.upper().startswith("SCRAM")
                else "org.apache.kafka.common.security.plain.PlainLoginModule"
            )
            username = self.kafka_sasl_username or ""
            options["kafka.sasl.jaas.config"] = (
                f'{module} required username="{_jaas_quoted(username)}" password="{_jaas_quoted(password)}";'
            )
        if self.kafka_ssl_cafile:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = str(self.kafka_ssl_cafile)
        return options

    def spark_kafka_sink_options(self) -> dict[str, str]:
        """Options for Spark's Kafka sink: the client's, and a producer that fills its batches."""
        return {**self.spark_kafka_options(), **SINK_PRODUCER_OPTIONS}


class SparkSettings(_Slice):
    """The Spark session (executor.control.spark_session)."""

    spark_master: str
    spark_remote: str | None
    spark_driver_memory: str
    spark_conf: dict[str, str]
    spark_log_level: Literal["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"]
    # Derived: where the session's logs and Ivy cache go (hotswap's home), the jars, the app's name.
    home_dir: Path
    jar_cache: Path
    app_name: str
    delta_lake: bool  # the sink is a Delta table: the session loads Delta's extension and catalog
    # Where checkpoints live, and the S3 API of an s3a:// root (Settings explains each).
    checkpoint_root: str | None
    s3_endpoint: str | None
    s3_region: str | None
    s3_access_key: SecretStr | None
    s3_secret_key: SecretStr | None
    s3_path_style: bool | None
    object_store: bool  # derived: checkpoints are on an object store; the session loads Hadoop's S3 client


class ControlSettings(_Slice):
    """The namespace's control state: its Redis, its lease and its names."""

    namespace: str
    redis_may_lose_writes: bool
    lease_ttl: Duration
    lease_wait: Duration
    # Derived.
    redis_dsn: SecretStr
    names: Names


class PipelineSettings(_Slice):
    """The pipeline: its topics, its windows and watermark, its batches and its graphs."""

    source_topic: str
    sink_topic: str
    source_partitions: int
    topic_replication_factor: int
    topic_min_insync_replicas: int | None
    window: Duration
    lateness: Duration
    idle_timeout: OffOrDuration
    max_time_jump: Duration
    max_offsets_per_trigger: int
    trigger_interval: OffOrDuration
    sink_compacted: bool
    sink: SinkSpec  # derived: where results land (contract.sink)
    sink_url: SecretStr | None
    graph_engine: GraphEngine
    graph_partitions: int | None
    keep_retired_topics: bool
    journal_retention: int
    names: Names  # derived: the namespace's topics, checkpoints and query names

    @property
    def processing_time(self) -> str | None:
        """The argument of Spark's `trigger(processingTime=...)`, or None for the default trigger."""
        return None if self.trigger_interval is None else f"{self.trigger_interval.ms} milliseconds"


class QueryRules(_Slice):
    """What a submitted query may do (README, "Security")."""

    query_kinds: frozenset[QueryKind]
    static_tables: dict[str, StaticTable]


class Timeouts(_Slice):
    """The bounded waits of a swap and of the control loop."""

    validation_timeout: Duration
    deploy_timeout: Duration
    batch_stall_timeout: OffOrDuration
    retire_timeout: Duration
    cut_timeout: Duration
    retry_deadline: Duration


class RecoverySettings(_Slice):
    """What happens when a query fails: restarts, automatic rollback, poison batches."""

    query_restarts: int
    query_restart_backoff: Duration
    auto_rollback: bool
    rollback_failures: int | None
    rollback_window: Duration
    poison_batches: Literal["fail", "dead_letter"]


class SourceSettings(_Slice):
    """How the user's topic is read (README, "Your own topic"; contract/source.py)."""

    source_format: SourceFormat
    source_schema: str
    avro_schema: Path | None
    avro_wire: AvroWire
    event_time: str
    event_time_unit: EpochUnit
    timestamp_format: str | None

    def source_spec(self) -> SourceSpec:
        """The declared source, with the Avro schema file read (its Spark schema is derived when the
        executor starts: execution_graph.schemas)."""
        avro_text = None
        if self.avro_schema is not None:
            try:
                avro_text = self.avro_schema.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read the Avro schema {self.avro_schema}: {exc.strerror}") from exc
        try:
            return SourceSpec(
                format=self.source_format,
                schema_ddl="" if self.source_format is SourceFormat.AVRO else self.source_schema,
                avro_schema=avro_text,
                avro_wire=self.avro_wire,
                event_time=self.event_time,
                event_time_unit=self.event_time_unit,
                timestamp_format=self.timestamp_format,
            )
        except ValidationError as exc:
            reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise ConfigError(f"invalid source: {reasons}") from exc


class OperatorSettings(_Slice):
    """The operator's side of the executor: its logs and its HTTP endpoint (issue 20)."""

    log_format: Literal["console", "json"]
    log_level: str
    metrics_port: int | None
    metrics_host: str
    metrics_token: SecretStr | None


SLICES: tuple[type[_Slice], ...] = (
    StackSettings,
    KafkaSettings,
    SparkSettings,
    ControlSettings,
    PipelineSettings,
    QueryRules,
    Timeouts,
    RecoverySettings,
    SourceSettings,
    OperatorSettings,
)


class Settings(BaseSettings):
    """Everything hotswap can be told. Durations (contract/durations.py) accept '10s', '500ms', '2m'
    or a number of milliseconds, and are used as `.ms` or `.s`."""

    model_config = SettingsConfigDict(env_prefix="HOTSWAP_", frozen=True, extra="forbid")

    # Where the embedded stack, fetched jars and Spark checkpoints live.
    home: Path = Path(".hotswap")
    # Jars `hotswap stack fetch` gets from Maven Central (default: <home>/jars): the embedded broker's and
    # Spark's Kafka connector, which the Spark session uses when present (the offline option).
    # Tests share one cache across homes.
    jars_dir: Path | None = None
    # Where Spark checkpoints live (default: <home>/checkpoints): a directory that every Spark process
    # of the deployment sees, or an object store through the S3 API, s3a://bucket/prefix (docs/
    # operations.md, "Checkpoints on an S3 API"). Each namespace keeps its own folder below it.
    checkpoint_root: str | None = None
    # The S3 API behind an s3a:// checkpoint root. No endpoint: AWS itself; another store (MinIO,
    # s3proxy, Ceph) is named by its URL, e.g. http://127.0.0.1:9000. No keys: the AWS credential
    # chain (environment, profile, instance role).
    s3_endpoint: str | None = None
    # The region requests are signed for. None: the bucket's own on AWS, us-east-1 for another store.
    s3_region: str | None = None
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    # Path-style addresses (endpoint/bucket/key), which most stores other than AWS need. None: on
    # when s3_endpoint is set.
    s3_path_style: bool | None = None
    # Every Redis key, topic and checkpoint of one deployment sits under its namespace.
    # No dots: topic names put the namespace between dots (hotswap.<ns>.graph.<id>), and a dot in
    # it would let one namespace's topics pass for another's.
    namespace: str = Field(default="default", pattern=r"^[A-Za-z0-9_-]+$")

    # Existing services: when set, `hotswap stack up` starts nothing for them.
    kafka_bootstrap: str | None = None
    redis_url: SecretStr | None = None

    # Kafka client security, passed to both kafka-python and Spark's connector.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None

    # The embedded stack (used when kafka_bootstrap / redis_url are not set).
    # With several brokers, node i (1..n) listens on kafka_port + i - 1 and kafka_controller_port + i - 1.
    kafka_brokers: int = Field(default=1, ge=1, le=9)
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    kafka_heap: str = "384m"
    redis_port: int = 6379
    # `hotswap stack up` also starts PostgreSQL, for the postgres sink (`stack up --postgres`).
    stack_postgres: bool = False
    postgres_port: int = 5433  # not 5432: a system PostgreSQL may hold that

    # Spark: the session is built in one place (executor.control.spark_session) from these.
    # local[N], spark://host:port (standalone), k8s://https://host:port, yarn: any master Spark takes.
    spark_master: str = "local[2]"
    # A Spark Connect server (sc://host:port). Refused at start: hotswap's driver-side state cannot
    # live behind Spark Connect (README, "Running on a cluster").
    spark_remote: str | None = None
    spark_driver_memory: str = "1g"
    spark_conf: dict[str, str] = Field(default_factory=dict)
    spark_log_level: Literal["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"] = "ERROR"

    # The pipeline.
    source_topic: str = "events"
    sink_topic: str = "results"
    source_partitions: int = Field(default=2, ge=1)
    topic_replication_factor: int = Field(default=1, ge=1)
    # min.insync.replicas of the topics hotswap creates; None keeps the broker's default. With acks=all
    # a write then needs this many replicas, so a broker may die without losing an acknowledged row.
    topic_min_insync_replicas: int | None = Field(default=None, ge=1)
    window: Duration = Duration(10_000, "10s")
    lateness: Duration = Duration(5_000, "5s")
    # A partition with no new rows for this long stops holding the service watermark back; when
    # every partition is that quiet, the watermark advances with processing time. "off" (None) waits for data.
    idle_timeout: OffOrDuration = Duration(30_000, "30s")
    # An event more than this far ahead of the service watermark is dead-lettered: it moves no
    # watermark and no cut (one mis-stamped event must not close every open window).
    max_time_jump: Duration = Duration(3_600_000, "1h")
    # Upper bound of source rows per service-graph batch, and of graph-topic rows per execution-graph
    # batch, so a backlog is caught up in bounded micro-batches.
    max_offsets_per_trigger: int = Field(default=20_000, ge=1)
    # How often the service graph and each execution graph start a micro-batch: a processing-time
    # trigger on both queries. "off" (None) is Spark's default, the next batch as soon as the last one
    # ends. 500ms measured a lower p99 and a shorter swap than "off" (README, "Performance", "Trigger").
    trigger_interval: OffOrDuration = Duration(500, "500ms")
    # Create the results topic compacted (cleanup.policy=compact): a reader then keeps one record
    # per result key, i.e. per (window, group). Only applies when hotswap creates the topic.
    sink_compacted: bool = False
    # Where every version's results land (contract.sink): kafka:TOPIC (the default, kafka:<sink_topic>),
    # postgres:TABLE with sink_url, or delta:PATH (docs/sinks.md).
    sink: str | None = None
    # The sink's connection URL, for postgres: postgresql://user:password@host:5432/database.
    sink_url: SecretStr | None = None
    # How execution graphs compute their windows: "closing" (each window computed once, as a batch,
    # when every partition's marker has passed it; docs/architecture.md, "Two graph engines") or
    # "stateful" (a Spark streaming aggregation closed by Spark's watermark, on a one-partition topic).
    # Recorded per graph when it is deployed: a running graph keeps its engine.
    graph_engine: GraphEngine = GraphEngine.CLOSING
    # Partitions of a closing graph's topic (None: as many as the source topic has). A stateful
    # graph's topic always has one.
    graph_partitions: int | None = Field(default=None, ge=1, le=1024)
    keep_retired_topics: bool = False
    # How many ended swaps the journal keeps for `history` and `status`. Older ones are forgotten
    # once none of their queries serves, with their retired graphs' records, progress, checkpoints
    # and topics: a namespace that swaps for months keeps a bounded Redis, broker and disk.
    journal_retention: int = Field(default=100, ge=1)

    # -- What a submitted query may do (README, "Security") -----------------------------------
    # The kinds of query file accepted: "sql", or "sql,python". A .py query runs as code with the
    # executor's rights, so it is refused unless the operator allows it here.
    query_kinds: Annotated[frozenset[QueryKind], NoDecode] = frozenset({QueryKind.SQL})
    # Tables a query may read besides `events`, by the name it reads them under (a JSON object in
    # HOTSWAP_STATIC_TABLES: {"countries": {"path": "/data/countries", "format": "parquet"}}).
    static_tables: dict[str, StaticTable] = Field(default_factory=dict)

    # Run on a Redis that may lose acknowledged writes (no append-only file, or appendfsync not
    # "always"): a Redis crash may then lose a recorded cut, and a swap be decided twice.
    redis_may_lose_writes: bool = False

    # Bounded waits.
    # How long the analysis of a submitted query (or of a dry run) may take before the query is
    # rejected (validation_timeout); its thread is abandoned, as Spark's analysis cannot be cancelled.
    validation_timeout: Duration = Duration(120_000, "120s")
    deploy_timeout: Duration = Duration(120_000, "120s")
    # A micro-batch of the service graph or of an execution graph that runs longer than this has
    # stalled (a hung task, a cluster that lost its executors): it is cancelled, counted, and its
    # query restarted from its checkpoint (one of query_restarts). "off" (None): no watch.
    batch_stall_timeout: OffOrDuration = Duration(300_000, "300s")
    # When the serving query fails for good on a batch (its restarts spent): "fail" leaves it failed
    # until `hotswap replace`; "dead_letter" sends that batch's rows to the dead-letter topic
    # (reason poison_batch), counts them, and goes on without them. Off by default: it drops rows
    # from results, which only the operator may choose.
    poison_batches: Literal["fail", "dead_letter"] = "fail"
    # How long a drained old graph's query may take to stop before the swap goes on without it (it
    # has emitted every window it owns; the ownership filter drops anything it would still write).
    retire_timeout: Duration = Duration(60_000, "60s")
    # How long a deployed swap waits for its cut.
    cut_timeout: Duration = Duration(300_000, "300s")
    # The executor's lease on a namespace, and how long a starting executor waits for a dead
    # predecessor's lease to expire (0: refuse at once).
    lease_ttl: Duration = Duration(15_000, "15s")
    lease_wait: Duration = Duration(20_000, "20s")
    # A failed query is restarted from its checkpoint this many times, with doubling back-off.
    query_restarts: int = Field(default=3, ge=0)
    query_restart_backoff: Duration = Duration(2_000, "2s")
    # Automatic rollback (README, "Automatic rollback"): every swap rolls back on its own when its new
    # query fails for good after its cut, as if `submit --auto-rollback` had been given.
    auto_rollback: bool = False
    # Its error budget: a swap with auto-rollback whose new query fails more than this many times
    # within rollback_window after its cut is rolled back then, without using up its restarts.
    # None: only a query that fails for good (query_restarts spent) is rolled back.
    rollback_failures: int | None = Field(default=None, ge=0)
    rollback_window: Duration = Duration(600_000, "10m")
    # Transient Kafka errors in the control loop (broker restarting, leader moving) are retried with
    # back-off for this long before the operation is given up with a reason; so is a graph's batch,
    # without counting against its restarts, while a stalled predecessor still writes its checkpoint
    # or its table sink is away.
    retry_deadline: Duration = Duration(60_000, "60s")

    log_format: Literal["console", "json"] = "console"
    log_level: str = "info"

    # -- The source: how the user's topic is read (README, "Your own topic"; contract/source.py) --
    source_format: SourceFormat = SourceFormat.JSON
    # The record's schema as Spark DDL (JSON); with Avro, the .avsc in avro_schema replaces it.
    source_schema: str = DEFAULT_SCHEMA
    avro_schema: Path | None = None
    avro_wire: AvroWire = AvroWire.CONFLUENT
    # A top-level column, a dotted path into a struct (meta.ts), or "kafka" (the record's timestamp).
    event_time: str = DEFAULT_EVENT_TIME
    # The unit of an integer event-time column.
    event_time_unit: EpochUnit = EpochUnit.MS
    # A Spark datetime pattern for timestamps that are not ISO-8601 text (JSON only).
    timestamp_format: str | None = None
    # -- Watching a swap (issue 20): the executor's HTTP endpoint -----------------------------
    # `/metrics` (Prometheus) and `/` (the dashboard) on this port of the executor; None: not served.
    # 0 takes any free port (the executor logs which).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # Loopback by default: the page shows query texts. 0.0.0.0 serves every interface.
    metrics_host: str = "127.0.0.1"
    # The token the dashboard and /api/status want when metrics_host is not loopback (None: one is
    # generated at start and printed once). /metrics and /healthz stay open.
    metrics_token: SecretStr | None = None

    @field_validator("spark_remote")
    @classmethod
    def _connect_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("sc://"):
            raise ValueError(f"{value!r} is not a Spark Connect URL (sc://host:port)")
        return value

    @field_validator("query_kinds", mode="before")
    @classmethod
    def _query_kinds(cls, value: object) -> object:
        if isinstance(value, str):  # "sql,python", from the environment or the CLI
            return frozenset(part.strip().lower() for part in value.split(",") if part.strip())
        return value

    @field_validator("static_tables")
    @classmethod
    def _static_table_names(cls, value: dict[str, StaticTable]) -> dict[str, StaticTable]:
        for name in value:
            if not name.isidentifier() or name.lower() == "events":
                raise ValueError(f"static table name {name!r} must be a SQL identifier other than events")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        # redis-py raises a ValueError deep in a connection for any other scheme; say it here, in one line.
        if value is not None and not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("a Redis URL starts with redis://, rediss:// (TLS) or unix://, e.g. redis://host:6379/0")
        return value

    @model_validator(mode="before")
    @classmethod
    def _kafka_sink_names_the_topic(cls, data: Any) -> Any:
        # `--sink kafka:T` is another way to say sink_topic = T: everything that reads results reads it.
        if isinstance(data, dict) and isinstance(data.get("sink"), str):
            spec = SinkSpec.parse(data["sink"])
            if spec.is_kafka:
                topic = data.get("sink_topic")
                if topic is not None and topic != spec.target:
                    raise ValueError(f"sink {spec} and sink_topic {topic!r} name two results topics; give one")
                data = {**data, "sink_topic": spec.target}
        return data

    @field_validator("sink_url")
    @classmethod
    def _sink_url_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("a sink URL starts with postgresql://, e.g. postgresql://user:password@host:5432/db")
        return value

    @field_validator("checkpoint_root")
    @classmethod
    def _checkpoint_scheme(cls, value: str | None) -> str | None:
        if value is None or "://" not in value:
            return value
        scheme, _, rest = value.partition("://")
        if scheme != "s3a":
            hint = " (Hadoop's S3 client is s3a://)" if scheme in ("s3", "s3n") else ""
            raise ValueError(
                f"checkpoint_root {value!r}: a checkpoint root is a local directory or s3a://bucket/prefix{hint}"
            )
        if not rest.split("/", 1)[0]:
            raise ValueError(f"checkpoint_root {value!r} names no bucket; write s3a://bucket/prefix")
        return value

    @field_validator("s3_endpoint")
    @classmethod
    def _s3_endpoint_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"s3_endpoint {value!r} is a URL: http://host:port or https://host")
        return value

    @field_validator("window")
    @classmethod
    def _window(cls, value: Duration) -> Duration:
        if value.ms <= 0:
            raise ValueError("the window must be longer than 0")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if (self.s3_access_key is None) != (self.s3_secret_key is None):
            raise ValueError("s3_access_key and s3_secret_key go together: set both, or neither for AWS's chain")
        if self.sink_spec.kind is SinkKind.POSTGRES and self.sink_url is None:
            raise ValueError(
                f"sink {self.sink_spec} needs its database: set sink_url (HOTSWAP_SINK_URL, --sink-url), e.g. "
                "postgresql://user:password@host:5432/db"
            )
        isr = self.topic_min_insync_replicas
        if isr is not None and isr > self.topic_replication_factor:
            raise ValueError(
                f"topic_min_insync_replicas ({isr}) is above topic_replication_factor "
                f"({self.topic_replication_factor}): no write could ever be acknowledged; lower it or add replicas"
            )
        if self.kafka_bootstrap is None and self.kafka_brokers > 1:
            brokers = set(self.embedded_kafka_ports)
            controllers = set(self.embedded_controller_ports)
            if brokers & controllers:
                n = self.kafka_brokers
                raise ValueError(
                    f"the {n} embedded brokers' ports {self.kafka_port}-{self.kafka_port + n - 1} and their "
                    f"controller ports {self.kafka_controller_port}-{self.kafka_controller_port + n - 1} overlap; "
                    f"set kafka_controller_port (HOTSWAP_KAFKA_CONTROLLER_PORT) to {self.kafka_port + 100}, say"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = Path(os.environ.get("HOTSWAP_CONFIG_FILE", DEFAULT_CONFIG_FILE))
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file))

    # -- The slices (above): each class takes the one of its concern ----------------------------
    def _slice(self, cls: type[_S], **derived: Any) -> _S:
        own = {name: getattr(self, name) for name in cls.model_fields if name not in derived}
        return cls(**own, **derived)

    @property
    def stack(self) -> StackSettings:
        return self._slice(StackSettings)

    @property
    def kafka(self) -> KafkaSettings:
        return self._slice(KafkaSettings, bootstrap=self.bootstrap)

    @property
    def spark(self) -> SparkSettings:
        return self._slice(
            SparkSettings,
            home_dir=self.home,
            jar_cache=self.jar_cache,
            app_name=f"hotswap-{self.namespace}",
            delta_lake=self.sink_spec.kind is SinkKind.DELTA,
            object_store=self.names.local_checkpoint_root is None,
        )

    @property
    def control(self) -> ControlSettings:
        return self._slice(ControlSettings, redis_dsn=SecretStr(self.redis_dsn), names=self.names)

    @property
    def pipeline(self) -> PipelineSettings:
        return self._slice(PipelineSettings, names=self.names, sink=self.sink_spec)

    @property
    def sink_spec(self) -> SinkSpec:
        """Where results land: the declared sink, else the results topic."""
        return SinkSpec.parse(self.sink) if self.sink else SinkSpec(SinkKind.KAFKA, self.sink_topic)

    @property
    def queries(self) -> QueryRules:
        return self._slice(QueryRules)

    @property
    def timeouts(self) -> Timeouts:
        return self._slice(Timeouts)

    @property
    def recovery(self) -> RecoverySettings:
        return self._slice(RecoverySettings)

    @property
    def source(self) -> SourceSettings:
        return self._slice(SourceSettings)

    @property
    def operator(self) -> OperatorSettings:
        return self._slice(OperatorSettings)

    # Derived values, computed by their slice and never stored, so they cannot disagree with the
    # fields above; here too for the composition root and the tests.
    @property
    def jar_cache(self) -> Path:
        return self.stack.jar_cache

    @property
    def embedded_kafka_ports(self) -> tuple[int, ...]:
        return self.stack.embedded_kafka_ports

    @property
    def embedded_controller_ports(self) -> tuple[int, ...]:
        return self.stack.embedded_controller_ports

    @property
    def bootstrap(self) -> str:
        return self.stack.bootstrap

    @property
    def redis_dsn(self) -> str:
        return self.stack.redis_dsn

    @property
    def names(self) -> Names:
        """Topics, checkpoints and Spark query names of this namespace (contract/names.py)."""
        return Names(self.namespace, self.home, self.checkpoint_root)

    def source_spec(self) -> SourceSpec:
        return self.source.source_spec()

    def kafka_python_config(self) -> dict[str, Any]:
        return self.kafka.kafka_python_config()

    @property
    def processing_time(self) -> str | None:
        return self.pipeline.processing_time

    def spark_kafka_options(self) -> dict[str, str]:
        return self.kafka.spark_kafka_options()


def _jaas_quoted(value: str) -> str:
    """A value for a double-quoted JAAS option: Kafka's parser (a Java StreamTokenizer) reads a
    backslash as an escape, so a `"` or `\\` in a password must be escaped, or the line breaks."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def load_settings(**overrides: Any) -> Settings:
    """Build settings, with CLI flags (non-None keyword arguments) on top of env and TOML."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        # A check of several settings together has no field to name.
        problems = "; ".join(
            ": ".join(
                part
                for part in (".".join(str(p) for p in error["loc"]), error["msg"].removeprefix("Value error, "))
                if part
            )
            for error in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from exc
    except SettingsError as exc:  # an environment variable that must be JSON and is not
        raise ConfigError(f"invalid settings: {exc} (it must be JSON)") from exc
    except (OSError, ValueError) as exc:  # the TOML file: unreadable, or not TOML
        raise ConfigError(f"invalid settings: the config file cannot be read: {exc}") from exc
