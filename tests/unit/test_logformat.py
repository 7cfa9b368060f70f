"""The JSON log formatter, the log/event-loop settings, and the event-loop choice."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import pytest

from service import config, eventloop
from service.config import ConfigError
from service.logformat import MAX_MESSAGE_CHARS, REQUIRED_KEYS, JsonFormatter, json_line


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("service.test", logging.INFO, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_one_line_of_json_with_the_required_keys() -> None:
    line = JsonFormatter().format(_record("backend %s opened\nsecond line", "redis"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert set(parsed) == set(REQUIRED_KEYS)
    assert parsed["level"] == "INFO" and parsed["logger"] == "service.test"
    assert parsed["message"] == "backend redis opened\nsecond line"
    assert parsed["time"].endswith("Z") and "T" in parsed["time"]


def test_trace_ids_are_added_only_when_there_is_a_span() -> None:
    ids: list[tuple[str, str] | None] = [("ab" * 16, "cd" * 8)]
    formatter = JsonFormatter(lambda: ids[0])
    assert json.loads(formatter.format(_record("x")))["trace_id"] == "ab" * 16
    ids[0] = None
    assert "trace_id" not in json.loads(formatter.format(_record("x")))


def test_a_failing_tracer_never_loses_the_line() -> None:
    def broken() -> tuple[str, str] | None:
        raise RuntimeError("tracer down")

    assert json.loads(JsonFormatter(broken).format(_record("still here")))["message"] == (
        "still here"
    )


def test_extra_attributes_never_reach_the_line() -> None:
    line = JsonFormatter().format(_record("commit", sender="alice-secret", cmid="cm-secret"))
    assert "alice-secret" not in line and "cm-secret" not in line


def test_exceptions_give_their_type_and_frames_but_not_their_text() -> None:
    try:
        raise ConnectionError("Error 111 connecting to 10.1.2.3:6379 with password hunter2")
    except ConnectionError:
        record = _record("backend call failed")
        record.exc_info = sys.exc_info()
    parsed = json.loads(JsonFormatter().format(record))
    assert parsed["exception"] == "ConnectionError"
    assert "test_exceptions_give_their_type" in parsed["traceback"]
    assert "10.1.2.3" not in json.dumps(parsed) and "hunter2" not in json.dumps(parsed)


def test_bad_arguments_and_huge_messages_still_make_one_json_line() -> None:
    parsed = json.loads(JsonFormatter().format(_record("%d items", "not-a-number")))
    assert "did not fit" in parsed["message"]
    huge = json.loads(JsonFormatter().format(_record("x" * (MAX_MESSAGE_CHARS * 2))))
    assert len(huge["message"]) < MAX_MESSAGE_CHARS + 20


def test_a_start_up_error_line_is_json_too() -> None:
    parsed = json.loads(json_line(logging.ERROR, "service.cli", "message-committer: no backend"))
    assert parsed["level"] == "ERROR" and parsed["message"] == "message-committer: no backend"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MC_LOG_FORMAT": "yaml"}, "MC_LOG_FORMAT/--log-format must be text or json"),
        ({"MC_EVENT_LOOP": "trio"}, "MC_EVENT_LOOP/--event-loop must be auto, asyncio or uvloop"),
    ],
)
def test_bad_log_format_or_event_loop_is_a_config_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load({}, {"MC_BACKEND": "memory", **env})
    assert str(caught.value) == message


def test_log_format_and_event_loop_defaults() -> None:
    loaded = config.load({"log_format": "json"}, {"MC_BACKEND": "memory"})
    assert (loaded.log_format, loaded.event_loop) == ("json", "auto")


@pytest.mark.parametrize(("choice", "name"), [("auto", "uvloop"), ("uvloop", "uvloop")])
def test_uvloop_is_used_when_installed(choice: str, name: str) -> None:
    async def which() -> str:
        return eventloop.running_loop_name()

    assert eventloop.run(which(), choice) == name
    assert eventloop.run(which(), "asyncio") == "asyncio"


def test_insisting_on_a_missing_uvloop_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if the extra were not installed
    assert eventloop.resolve("auto") == ("asyncio", None)
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        eventloop.run(asyncio.sleep(0), "uvloop")
