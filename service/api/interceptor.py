"""The one server interceptor: exceptions to statuses, and the grpc_server_* metrics.

Servicers raise domain exceptions and never build statuses themselves; this
interceptor turns whatever escapes a handler into the status of
``service.api.errors.STATUS_TABLE`` (INTERNAL "internal error" for anything
else, logged with its type and where it was raised, never its text) and
counts every RPC, of every service (health and reflection included), by
method and code. A unary request whose
bytes do not parse as the method's message is INVALID_ARGUMENT
(INVALID_REQUEST) too; grpc alone would answer UNKNOWN with the parser's text.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from grpc import aio
from prometheus_client import Counter

from service.api import errors
from service.api.gate import WRITE_METHODS, WriteGate
from service.api.limits import RpcLimits, owner_of
from service.domain.errors import InvalidRequest
from service.metrics import ServiceMetrics

log = logging.getLogger(__name__)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class _Rpc:
    """One method's labels and its labelled series, looked up once (issue 27:
    ``labels()`` per call was a lock and a dict walk three times per RPC)."""

    __slots__ = ("_handled", "_metrics", "labels", "method", "seconds", "service", "started")

    def __init__(self, metrics: ServiceMetrics, grpc_type: str, service: str, method: str) -> None:
        self.service = service
        self.method = method
        self.labels = (grpc_type, service, method)
        self._metrics = metrics
        self.started = metrics.grpc_started.labels(*self.labels)
        self.seconds = metrics.grpc_seconds.labels(*self.labels)
        self._handled: dict[grpc.StatusCode, Counter] = {}

    def handled(self, code: grpc.StatusCode) -> Counter:
        """The handled counter of ``code`` (made on its first use, as ``labels()`` does)."""
        child = self._handled.get(code)
        if child is None:
            child = self._handled[code] = self._metrics.grpc_handled.labels(*self.labels, code.name)
        return child


# (grpc_type label, RpcMethodHandler attribute, handler factory), one per RPC shape.
_KINDS: tuple[tuple[str, str, Callable[..., Handler]], ...] = (
    ("unary", "unary_unary", grpc.unary_unary_rpc_method_handler),
    ("server_stream", "unary_stream", grpc.unary_stream_rpc_method_handler),
    ("client_stream", "stream_unary", grpc.stream_unary_rpc_method_handler),
    ("bidi_stream", "stream_stream", grpc.stream_stream_rpc_method_handler),
)


class StatusInterceptor(aio.ServerInterceptor):
    """Maps exceptions to statuses and records per-RPC metrics."""

    def __init__(
        self,
        metrics: ServiceMetrics,
        max_request_bytes: int = 0,
        limits: RpcLimits | None = None,
        gate: WriteGate | None = None,
    ) -> None:
        """``gate``: checked before each unary write method (``WRITE_METHODS``) reaches
        its handler, so a refusal is mapped, counted and traced like any other error;
        here rather than in an interceptor of its own, which cost every RPC one more
        ``intercept_service`` and every write one more coroutine (issue 27)."""
        self._metrics = metrics
        self._max_request_bytes = max_request_bytes
        self.limits = limits or RpcLimits()
        self._gate = gate
        # method -> (the servicer's handler, our wrapped one): grpc hands back the
        # same registered handler for a method, so it is wrapped once, not per call.
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped_handler = self._wrap(handler, handler_call_details.method)
        self._wrapped[handler_call_details.method] = (handler, wrapped_handler)
        return wrapped_handler

    def _wrap(self, handler: Handler, full_method: str) -> Handler:
        service, _, method = full_method.lstrip("/").partition("/")
        grpc_type, attribute, make = next(k for k in _KINDS if getattr(handler, k[1]) is not None)
        behavior = getattr(handler, attribute)
        rpc = _Rpc(self._metrics, grpc_type, service, method)
        wrapped = (
            self._wrap_generator(behavior, rpc)
            if inspect.isasyncgenfunction(behavior)
            else self._wrap_coroutine(
                behavior,
                rpc,
                self._gate if grpc_type == "unary" and full_method in WRITE_METHODS else None,
            )
        )
        deserializer = handler.request_deserializer
        if not handler.request_streaming and deserializer is not None:
            deserializer = _lenient(deserializer, self._max_request_bytes)
        return make(
            wrapped,
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap_coroutine(
        self, behavior: Any, rpc: _Rpc, gate: WriteGate | None
    ) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            start = self._started(rpc)
            code = grpc.StatusCode.UNKNOWN
            refused = self.limits.take_unary()
            try:
                if refused is not None:
                    code = grpc.StatusCode.RESOURCE_EXHAUSTED
                    await context.abort(code, refused)
                _check_decoded(request)
                if gate is not None:
                    gate.check()
                response = behavior(request, context)
                if inspect.isawaitable(response):
                    response = await response
                code = grpc.StatusCode.OK
                return response
            except (aio.AbortError, asyncio.CancelledError) as exc:
                code = _code_of(exc, context)
                raise
            except Exception as exc:
                status = _status_for(exc, rpc)
                code = status.code
                await _abort(context, status)
            finally:
                if refused is None:
                    self.limits.give_unary()
                self._handled(rpc, code, start)

        return call

    def _wrap_generator(self, behavior: Any, rpc: _Rpc) -> Callable[..., AsyncIterator[Any]]:
        async def stream(
            request: Any, context: aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            start = self._started(rpc)
            code = grpc.StatusCode.UNKNOWN
            owner = owner_of(request)
            refused = self.limits.take_stream(owner)
            try:
                if refused is not None:
                    code = grpc.StatusCode.RESOURCE_EXHAUSTED
                    await context.abort(code, refused)
                _check_decoded(request)
                async for response in behavior(request, context):
                    yield response
                code = grpc.StatusCode.OK
            except (aio.AbortError, asyncio.CancelledError) as exc:
                code = _code_of(exc, context)
                raise
            except Exception as exc:
                status = _status_for(exc, rpc)
                code = status.code
                await _abort(context, status)
            finally:
                if refused is None:
                    self.limits.give_stream(owner)
                self._handled(rpc, code, start)

        return stream

    def _started(self, rpc: _Rpc) -> float:
        rpc.started.inc()
        return time.perf_counter()

    def _handled(self, rpc: _Rpc, code: grpc.StatusCode, start: float) -> None:
        seconds = time.perf_counter() - start
        rpc.handled(code).inc()
        rpc.seconds.observe(seconds)
        if log.isEnabledFor(logging.DEBUG):  # the access log: method, code, time; no ids
            log.debug("%s/%s %s in %.2f ms", rpc.service, rpc.method, code.name, seconds * 1e3)


async def _abort(context: aio.ServicerContext[Any, Any], status: grpc.Status) -> None:
    """``abort_with_status`` spelled as ``abort``, which a wrapping context (the
    tracing interceptor's) sees, so the server span records the status code."""
    await context.abort(status.code, status.details, status.trailing_metadata)


class _Refused:
    """Stands in for a request that was not decoded: its bytes are not a message
    of the method's type, or there are too many of them."""

    def __init__(self, error: Exception) -> None:
        self.error = error


_UNDECODABLE = _Refused(InvalidRequest("the request is not a valid message of this method's type"))


def _lenient(deserializer: Callable[[bytes], Any], max_bytes: int) -> Callable[[bytes], Any]:
    """``deserializer``, except that bytes it cannot parse, or more than
    ``max_bytes`` of them (0: no limit), become a ``_Refused``.

    Left to grpc, a parse error is answered UNKNOWN with the parser's own text
    and an oversized request RESOURCE_EXHAUSTED without details; this way the
    handler wrapper answers both from the table, with ErrorInfo.
    """

    def deserialize(data: bytes) -> Any:
        if max_bytes and len(data) > max_bytes:
            return _Refused(errors.RequestTooLarge(f"the request is larger than {max_bytes} bytes"))
        try:
            return deserializer(data)
        except Exception:  # DecodeError, bad UTF-8 in a string field, ...
            return _UNDECODABLE

    return deserialize


def _check_decoded(request: Any) -> None:
    if isinstance(request, _Refused):
        raise request.error


def _status_for(exc: Exception, rpc: _Rpc) -> grpc.Status:
    """The table's status for ``exc``; an unmapped exception is logged by its type
    and where it was raised, never its text (it may carry a request's values)."""
    if errors.rule_for(exc) is None:
        log.error(
            "%s/%s failed: unexpected %s at %s",
            rpc.service,
            rpc.method,
            type(exc).__name__,
            raised_at(exc),
        )
    return errors.to_status(exc)


def raised_at(exc: BaseException, frames: int = 4) -> str:
    """The innermost ``frames`` of ``exc``'s traceback as ``file:line function``,
    innermost first: code locations only, no values."""
    stack = traceback.extract_tb(exc.__traceback__)[-frames:]
    return (
        " < ".join(
            f"{os.path.basename(frame.filename)}:{frame.lineno} {frame.name}"
            for frame in reversed(stack)
        )
        or "(no traceback)"
    )


def _code_of(exc: BaseException, context: aio.ServicerContext[Any, Any]) -> grpc.StatusCode:
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
