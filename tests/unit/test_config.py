"""Configuration: flags over environment over defaults, validation, secrets, the README table."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from service import bootstrap, config
from service.config import ConfigError, ServiceConfig, format_duration, parse_duration

README = Path(__file__).resolve().parents[2] / "README.md"


def _flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def test_flags_win_over_the_environment_which_wins_over_defaults() -> None:
    env = {"MC_BACKEND": "redis", "MC_REDIS_URL": "redis://x", "MC_RECOVERY_BATCH": "7"}
    loaded = config.load(_flags("--backend", "memory", "--recovery-interval", "250ms"), env)
    assert loaded.backend == "memory"  # flag
    assert loaded.recovery_batch == 7  # environment
    assert loaded.recovery_interval == 0.25  # flag, parsed
    assert loaded.shutdown_grace == 10.0  # default


def test_every_field_has_a_docstring_an_env_var_and_a_parser() -> None:
    fields = dataclasses.fields(ServiceConfig)
    options = config.options()
    assert [o.name for o in options] == [f.name for f in fields]
    for opt in options:
        assert opt.doc, f"{opt.name} has no docstring"
        assert opt.env == "MC_" + opt.name.upper()


def test_secrets_are_env_only_and_never_in_repr() -> None:
    flags = {o.name for o in config.options() if o.flag is None}
    assert flags == {"redis_url", "scylla_password"}
    loaded = config.load(
        {"backend": "redis"},
        {"MC_REDIS_URL": "redis://:hunter2@h:6379/0", "MC_SCYLLA_PASSWORD": "hunter2"},
    )
    assert loaded.redis_url.endswith("@h:6379/0")
    assert "hunter2" not in repr(loaded)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30.0),
        ("15m", 900.0),
        ("24h", 86400.0),
        ("7d", 604800.0),
        ("1.5", 1.5),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_durations_print_back_in_their_largest_unit() -> None:
    assert [format_duration(s) for s in (604800.0, 7200.0, 90.0, 0.25)] == [
        "7d",
        "2h",
        "90s",
        "250ms",
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no backend chosen"),
        ({"MC_BACKEND": "sqlite"}, "unknown backend"),
        ({"MC_BACKEND": "redis"}, "needs MC_REDIS_URL"),
        (
            {"MC_BACKEND": "scylla", "MC_SCYLLA_CONTACT_POINTS": " , "},
            "needs MC_SCYLLA_CONTACT_POINTS",
        ),
        ({"MC_BACKEND": "memory", "MC_GRPC_ADDRESS": "localhost"}, "HOST:PORT"),
        ({"MC_BACKEND": "memory", "MC_HTTP_ADDRESS": "h:70000"}, "HOST:PORT"),
        ({"MC_BACKEND": "memory", "MC_TLS_KEY": "k.pem"}, "TLS needs both"),
        ({"MC_BACKEND": "memory", "MC_TLS_CERT": "/no", "MC_TLS_KEY": "/no"}, "file not found"),
        ({"MC_BACKEND": "memory", "MC_LOG_LEVEL": "LOUD"}, "MC_LOG_LEVEL"),
        ({"MC_BACKEND": "memory", "MC_RECOVERY_BATCH": "0"}, "MC_RECOVERY_BATCH must be positive"),
        ({"MC_BACKEND": "memory", "MC_RECOVERY_BATCH": "many"}, "MC_RECOVERY_BATCH: invalid value"),
        ({"MC_BACKEND": "memory", "MC_MAX_CONCURRENT_RPCS": "-1"}, "must not be negative"),
        ({"MC_BACKEND": "memory", "MC_REDIS_WAIT_REPLICAS": "-1"}, "auto or a number"),
        ({"MC_BACKEND": "memory", "MC_REDIS_WAIT_REPLICAS": "all"}, "auto or a number"),
        ({"MC_BACKEND": "memory", "MC_FANOUT_THRESHOLD": "0"}, "MC_FANOUT_THRESHOLD must be"),
        (
            {"MC_BACKEND": "memory", "MC_REDIS_MAX_CONNECTIONS": "1"},
            "MC_REDIS_MAX_CONNECTIONS must be at least 2",
        ),
        ({"MC_BACKEND": "memory", "MC_RELAY_BATCH": "1001"}, "MC_RELAY_BATCH must be at most"),
        ({"MC_BACKEND": "memory", "MC_RELAY_LEASE": "500ms"}, "MC_RELAY_LEASE must be at least"),
        ({"MC_BACKEND": "memory", "MC_RELAY_BUSY_PAUSE": "2s"}, "MC_RELAY_BUSY_PAUSE must be"),
        (
            {"MC_BACKEND": "memory", "MC_RELAY_FIRST_RETRY": "2m", "MC_RELAY_MAX_RETRY": "1m"},
            "MC_RELAY_MAX_RETRY must be at least",
        ),
        ({"MC_BACKEND": "memory", "MC_RELAY_HTTP_ADDRESS": "nowhere"}, "HOST:PORT"),
        ({"MC_BACKEND": "memory", "MC_MAILBOX_RETENTION": "0s"}, "MC_MAILBOX_RETENTION must be"),
        (
            {"MC_BACKEND": "memory", "MC_MAILBOX_DEDUPE_WINDOW": "10m"},
            "MC_MAILBOX_DEDUPE_WINDOW must be at least 1h",
        ),
    ],
)
def test_bad_configuration_is_exit_code_2(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load({}, env)
    assert message in str(caught.value)
    assert caught.value.exit_code == 2
    for value in env.values():  # the message names the rule, never the value
        if value not in ("memory", "redis", "scylla", "0", "-1", ""):
            assert value not in str(caught.value).replace("MC_", "")


def test_ipv6_addresses_are_accepted() -> None:
    assert config.split_address("[::1]:50051", "x") == ("::1", 50051)


def test_relay_and_mailbox_settings_come_from_the_config() -> None:
    loaded = config.load(
        {"backend": "redis"},
        {
            "MC_REDIS_URL": "redis://x",
            "MC_RELAY_LEASE": "30s",
            "MC_FANOUT_THRESHOLD": "50",
            "MC_MAILBOX_MAX_ENTRIES": "7",
            "MC_RELAY_SETTLE_WINDOW": "4s",
        },
    )
    policy = loaded.relay_policy()
    assert (policy.lease_ms, policy.fanout_threshold, policy.batch) == (30_000, 50, 100)
    delivery = loaded.delivery_settings()
    assert (delivery.mailbox.max_entries, delivery.settle_window_ms) == (7, 4000)
    assert delivery.mailbox.retention_ms == 7 * 86_400_000


def test_limits_and_store_settings_come_from_the_config() -> None:
    loaded = config.load(
        {"backend": "memory"}, {"MC_IDEMPOTENCY_WINDOW": "24h", "MC_SENDER_BURST": "3"}
    )
    assert loaded.store_settings().idempotency_window_ms == 86_400_000
    assert loaded.limits().sender_burst == 3
    assert loaded.mailbox_settings().dedupe_window_ms == 86_400_000


def test_the_readme_table_lists_every_variable_with_its_default() -> None:
    readme = README.read_text()
    for opt in config.options():
        row = next((line for line in readme.splitlines() if f"`{opt.env}`" in line), None)
        assert row is not None, f"{opt.env} is not in the README"
        assert f"`{opt.default_text}`" in row or opt.default_text == "none", opt.env


@pytest.mark.parametrize(
    ("url", "setting", "waits", "warned"),
    [
        ("redis://127.0.0.1:6379/0", None, 0, False),
        ("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0", None, 1, False),
        ("rediss+cluster://127.0.0.1:7000/", None, 1, False),
        ("redis+sentinel://127.0.0.1:26379/mymaster/0", "0", 0, True),
        ("redis://127.0.0.1:6379/0", "2", 2, False),
    ],
)
def test_an_ack_waits_for_a_replica_by_default_where_a_failover_could_lose_it(
    url: str, setting: str | None, waits: int, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"MC_BACKEND": "redis", "MC_REDIS_URL": url}
    if setting is not None:
        env["MC_REDIS_WAIT_REPLICAS"] = setting
    loaded = config.load({}, env)
    assert bootstrap.redis_wait_replicas(loaded) == waits
    assert ("can lose acknowledged messages" in caplog.text) is warned
    assert "127.0.0.1" not in caplog.text  # the address is never logged
