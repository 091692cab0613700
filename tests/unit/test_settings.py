from pathlib import Path

import pytest
from pydantic import ValidationError

from hotswap.contract.errors import ConfigError
from hotswap.contract.models import QueryKind, QuerySource
from hotswap.contract.settings import SLICES, Settings, load_settings
from hotswap.execution_graph.confinement import check_kind, check_size
from hotswap.execution_graph.errors import QueryRejected


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (
        "HOTSWAP_KAFKA_BOOTSTRAP",
        "HOTSWAP_REDIS_URL",
        "HOTSWAP_NAMESPACE",
        "HOTSWAP_WINDOW",
        "HOTSWAP_CUT_TIMEOUT",
        "HOTSWAP_QUERY_KINDS",
        "HOTSWAP_STATIC_TABLES",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOTSWAP_CONFIG_FILE", str(tmp_path / "absent.toml"))


def test_defaults_point_at_the_embedded_stack() -> None:
    settings = Settings()
    assert settings.bootstrap == "127.0.0.1:9092"
    assert settings.redis_dsn == "redis://127.0.0.1:6379/0"
    assert settings.window.ms == 10_000


def test_environment_toml_and_flags_layer_in_that_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    toml = tmp_path / "hotswap.toml"
    toml.write_text('namespace = "from-toml"\nwindow = "20s"\nlateness = "7s"\n')
    monkeypatch.setenv("HOTSWAP_CONFIG_FILE", str(toml))
    monkeypatch.setenv("HOTSWAP_WINDOW", "30s")
    settings = load_settings(namespace="from-flag", sink_topic=None)
    assert settings.namespace == "from-flag"  # flag beats TOML
    assert str(settings.window) == "30s"  # environment beats TOML
    assert settings.lateness.ms == 7_000  # TOML beats the default
    assert settings.sink_topic == "results"  # an unset flag changes nothing


def test_bad_values_give_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="invalid settings"):
        load_settings(window="soon")
    with pytest.raises(ConfigError, match="invalid settings"):
        load_settings(namespace="has spaces")


def test_secrets_never_show_in_repr_or_dumps() -> None:
    settings = Settings(redis_url="redis://admin:hunter2@10.0.0.1:6379/0", kafka_sasl_password="s3cret")
    assert "hunter2" not in repr(settings)
    assert "s3cret" not in settings.model_dump_json()
    assert settings.redis_dsn.startswith("redis://admin:hunter2@")


def test_sasl_settings_reach_both_kafka_clients() -> None:
    settings = Settings(
        kafka_bootstrap="b1:9093,b2:9093",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="svc",
        kafka_sasl_password="pw",
    )
    python = settings.kafka_python_config()
    assert python["bootstrap_servers"] == ["b1:9093", "b2:9093"]
    assert python["sasl_plain_password"] == "pw"
    # Back within a second of a broker's return, as Java's client (kafka-python's own ceiling is 30 s).
    assert python["reconnect_backoff_max_ms"] <= 1000
    spark = settings.spark_kafka_options()
    assert spark["kafka.security.protocol"] == "SASL_SSL"
    assert 'username="svc"' in spark["kafka.sasl.jaas.config"]
    # Spark's Kafka sinks carry the same credentials, and fill their producer batches.
    sink = settings.kafka.spark_kafka_sink_options()
    assert sink["kafka.sasl.jaas.config"] == spark["kafka.sasl.jaas.config"]
    assert int(sink["kafka.batch.size"]) > 16_384
    assert int(sink["kafka.linger.ms"]) > 0


def test_names_are_derived_from_the_namespace() -> None:
    settings = Settings(namespace="prod")
    assert settings.names.graph_topic("q1") == "hotswap.prod.graph.q1"
    assert settings.names.late_topic == "hotswap.prod.late"
    assert Path(settings.names.service_checkpoint).parts[-2:] == ("prod", "service")


def test_a_checkpoint_root_is_a_directory_or_an_s3a_uri_with_the_namespace_below_it(tmp_path: Path) -> None:
    local = Settings(namespace="prod", checkpoint_root=str(tmp_path / "ck"))
    assert local.names.service_checkpoint == str(tmp_path / "ck" / "prod" / "service")
    assert local.names.local_checkpoint_root == tmp_path / "ck" / "prod"
    assert not local.spark.object_store
    store = Settings(namespace="prod", checkpoint_root="s3a://bucket/streams/")
    assert store.names.graph_checkpoint("q1") == "s3a://bucket/streams/prod/graph-q1"
    assert store.names.local_checkpoint_root is None
    assert store.spark.object_store
    with pytest.raises(ConfigError, match=r"s3a://bucket/prefix \(Hadoop's S3 client is s3a://\)"):
        load_settings(checkpoint_root="s3://bucket/x")
    with pytest.raises(ConfigError, match="names no bucket"):
        load_settings(checkpoint_root="s3a:///x")
    with pytest.raises(ConfigError, match="a local directory or s3a://"):
        load_settings(checkpoint_root="hdfs://nn/x")
    with pytest.raises(ConfigError, match="go together"):
        load_settings(checkpoint_root="s3a://b/x", s3_access_key="k")


def test_replication_of_hotswaps_topics_must_leave_writes_possible() -> None:
    settings = Settings(topic_replication_factor=3, topic_min_insync_replicas=2)
    assert (settings.topic_replication_factor, settings.topic_min_insync_replicas) == (3, 2)
    assert Settings().topic_min_insync_replicas is None  # the broker's default
    with pytest.raises(ConfigError, match=r"topic_min_insync_replicas \(3\) is above topic_replication_factor \(2\)"):
        load_settings(topic_replication_factor=2, topic_min_insync_replicas=3)


def test_several_embedded_brokers_are_all_in_the_bootstrap_list() -> None:
    settings = Settings(kafka_brokers=3, kafka_port=49092, kafka_controller_port=49192)
    assert settings.bootstrap == "127.0.0.1:49092,127.0.0.1:49093,127.0.0.1:49094"
    assert settings.kafka_python_config()["bootstrap_servers"] == settings.bootstrap.split(",")
    assert settings.embedded_controller_ports == (49192, 49193, 49194)
    # External brokers are named, never derived.
    assert Settings(kafka_brokers=3, kafka_bootstrap="b1:9092").bootstrap == "b1:9092"


def test_brokers_whose_ports_would_collide_are_refused_with_a_port_to_use() -> None:
    # The defaults 9092/9093 suit one broker; a second broker would listen on the first one's controller port.
    expected = r"overlap; set kafka_controller_port \(HOTSWAP_KAFKA_CONTROLLER_PORT\) to 9192"
    with pytest.raises(ConfigError, match=expected):
        load_settings(kafka_brokers=2)
    assert load_settings(kafka_brokers=2, kafka_controller_port=9192).bootstrap == "127.0.0.1:9092,127.0.0.1:9093"


def test_durations_are_typed_once_and_keep_their_text() -> None:
    settings = load_settings(window="2m", lateness="500ms", deploy_timeout=90_000, lease_ttl=" 15s ")
    assert (settings.window.ms, settings.window.s, str(settings.window)) == (120_000, 120.0, "2m")
    assert (settings.lateness.ms, str(settings.lateness)) == (500, "500ms")
    assert (settings.deploy_timeout.ms, str(settings.deploy_timeout)) == (90_000, "90s")  # plain ms
    assert str(settings.lease_ttl) == "15s"
    assert settings.model_dump(mode="json")["window"] == "2m"
    with pytest.raises(ConfigError, match=r"deploy_timeout: cannot read duration 'soon'"):
        load_settings(deploy_timeout="soon")
    with pytest.raises(ConfigError, match="window: the window must be longer than 0"):
        load_settings(window="0s")


def test_idle_timeout_may_be_off() -> None:
    assert load_settings(idle_timeout="off").idle_timeout is None
    assert load_settings(idle_timeout="OFF").model_dump(mode="json")["idle_timeout"] == "off"
    idle = load_settings(idle_timeout="45s").idle_timeout
    assert idle is not None
    assert idle.ms == 45_000


def test_both_queries_run_a_500ms_processing_time_trigger_unless_told_otherwise() -> None:
    assert Settings().processing_time == "500 milliseconds"
    assert load_settings(trigger_interval="off").processing_time is None
    assert load_settings(trigger_interval="1s").processing_time == "1000 milliseconds"
    assert load_settings(trigger_interval="250ms").model_dump(mode="json")["trigger_interval"] == "250ms"


def test_the_wait_for_a_cut_is_cut_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    assert str(Settings().cut_timeout) == "300s"
    assert load_settings(cut_timeout="40s").cut_timeout.ms == 40_000
    monkeypatch.setenv("HOTSWAP_CUT_TIMEOUT", "60s")
    assert Settings().cut_timeout.ms == 60_000


def test_a_redis_url_without_a_scheme_is_refused_in_one_line_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(redis_url="user:secret@host:6379/0")
    message = str(refused.value)
    assert "a Redis URL starts with redis://, rediss:// (TLS) or unix://" in message
    assert "secret" not in message
    assert "\n" not in message


def test_only_sql_queries_are_taken_unless_the_operator_allows_python(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().query_kinds == {QueryKind.SQL}
    monkeypatch.setenv("HOTSWAP_QUERY_KINDS", "sql, python")
    assert Settings().query_kinds == {QueryKind.SQL, QueryKind.PYTHON}
    with pytest.raises(ConfigError, match="invalid settings"):
        load_settings(query_kinds="sql,scala")


def test_a_static_table_is_named_by_an_identifier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTSWAP_STATIC_TABLES", '{"regions": {"path": "/data/regions", "format": "csv"}}')
    assert Settings().static_tables["regions"].format == "csv"
    for bad in ('{"events": {"path": "/x"}}', '{"a b": {"path": "/x"}}', '{"t": {"path": "/x", "format": "jdbc"}}'):
        monkeypatch.setenv("HOTSWAP_STATIC_TABLES", bad)
        with pytest.raises(ConfigError, match="invalid settings"):
            load_settings()


def test_a_python_query_is_refused_where_only_sql_is_allowed() -> None:
    source = QuerySource(name="model", kind=QueryKind.PYTHON, text="def query(events): return events")
    with pytest.raises(QueryRejected) as refused:
        check_kind(source, Settings().query_kinds)
    assert refused.value.reason_code == "query_kind_refused"
    assert "query_kinds = sql,python" in str(refused.value)
    check_kind(source, {QueryKind.SQL, QueryKind.PYTHON})
    with pytest.raises(QueryRejected) as too_large:
        check_size(source.model_copy(update={"text": "x" * (256 * 1024 + 1)}))
    assert too_large.value.reason_code == "query_too_large"


def test_every_setting_is_in_exactly_one_slice() -> None:
    owners: dict[str, list[str]] = {}
    for slice_ in SLICES:
        for name in slice_.model_fields:
            if name in Settings.model_fields:
                owners.setdefault(name, []).append(slice_.__name__)
    assert set(owners) == set(Settings.model_fields), "a setting no slice carries"
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}


def test_slices_carry_the_settings_and_what_derives_from_them() -> None:
    settings = Settings(namespace="prod", kafka_brokers=2, kafka_port=49092, kafka_controller_port=49192)
    assert settings.pipeline.window == settings.window
    assert settings.pipeline.names == settings.names
    assert settings.control.names.namespace == "prod"
    assert settings.kafka.bootstrap == "127.0.0.1:49092,127.0.0.1:49093"
    assert settings.spark.app_name == "hotswap-prod"
    assert settings.spark.jar_cache == settings.stack.jar_cache
    assert settings.control.redis_dsn.get_secret_value() == settings.redis_dsn
    with pytest.raises(ValidationError):
        settings.pipeline.__class__(**{**settings.pipeline.model_dump(), "extra": 1})
    secret = Settings(redis_url="redis://admin:hunter2@redis:6379/0", kafka_sasl_password="s3cr3t", metrics_token="tok")
    shown = " ".join(repr(part) for part in (secret.stack, secret.control, secret.kafka, secret.operator))
    assert "hunter2" not in shown
    assert "s3cr3t" not in shown
    assert "tok'" not in shown
