"""How ``serve`` writes its log: readable text (the default) or one JSON object per line.

``MC_LOG_FORMAT=json`` (``--log-format json``) makes every line on stderr a
JSON object::

    {"time": "2026-11-30T01:44:52.119Z", "level": "INFO", "logger": "service.bootstrap",
     "message": "backend redis opened (1 host(s))"}

plus ``trace_id`` and ``span_id`` (lower-case hex, as in W3C ``traceparent``)
when tracing is on and the line was logged inside a traced call, and
``exception`` (the type name) and ``traceback`` (``file:line in function`` per
frame, innermost first) when a record
carries an exception. Python warnings and an uncaught exception are routed
through the same formatter, so a platform's log pipeline never sees a line it
cannot parse.

The formatter is deliberately narrow, because a log line is read by more
people than the code is:

* it writes only the keys above, never a record's ``extra`` attributes (a
  caller cannot smuggle a field past it);
* an exception contributes its type and where it was raised, never its
  message (a driver's exception text carries the server's address) nor the
  source lines;
* a message is cut at ``MAX_MESSAGE_CHARS``; formatting never raises (a
  record whose arguments do not fit its format string is still logged).

What goes *into* a message is each caller's business: the service logs ids
of backends and counts, never a message body, a secret, an address, nor (at
INFO and above) a sender or a client message id. tests/security checks both
formats.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_MESSAGE_CHARS = 8192
REQUIRED_KEYS = ("time", "level", "logger", "message")

TraceIds = Callable[[], tuple[str, str] | None]
"""The (trace id, span id) of the current span, or None (service.tracing)."""


def _time(created: float) -> str:
    stamp = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module docstring for its keys."""

    def __init__(self, trace_ids: TraceIds | None = None) -> None:
        super().__init__()
        self._trace_ids = trace_ids

    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except Exception:  # bad arguments: keep the format string, say so
            message = f"{record.msg} (log arguments did not fit the format)"
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "...(cut)"
        out: dict[str, str] = {
            "time": _time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        ids = self._current_ids()
        if ids is not None:
            out["trace_id"], out["span_id"] = ids
        if record.exc_info and record.exc_info[0] is not None:
            out["exception"] = record.exc_info[0].__name__
            out["traceback"] = _frames(record.exc_info[2])
        if record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, ensure_ascii=True)

    def _current_ids(self) -> tuple[str, str] | None:
        if self._trace_ids is None:
            return None
        try:
            return self._trace_ids()
        except Exception:  # a log line is never lost to the tracer
            return None


def _frames(tb: TracebackType | None) -> str:
    """``file:line in function`` per frame, innermost first; no source text, no values."""
    return " <- ".join(
        f"{frame.filename}:{frame.lineno} in {frame.name}"
        for frame in reversed(traceback.extract_tb(tb))
    )


def configure(level: str, log_format: str, trace_ids: TraceIds | None = None) -> None:
    """Send every record at ``level`` and above to stderr in ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(trace_ids))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # redis-py (8.2 on) logs each failed connection at DEBUG with the server's host
    # and port; the backend reports every failure by error type alone.
    logging.getLogger("redis").setLevel(logging.CRITICAL)
    if log_format == "json":
        logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger
        sys.excepthook = _log_uncaught


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    logging.getLogger("service").critical("uncaught exception", exc_info=(kind, exc, tb))


def json_line(level: int, logger: str, message: str) -> str:
    """One line in the JSON format without a configured handler (start-up errors)."""
    record = logging.LogRecord(logger, level, __file__, 0, message, None, None)
    return JsonFormatter().format(record)
