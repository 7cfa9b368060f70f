"""Which asyncio event loop a process runs: uvloop when installed (the ``uvloop``
extra), else the standard one.

``MC_EVENT_LOOP`` / ``--event-loop`` (``service.config``) picks it for ``serve``;
the bench takes the same choice for its in-process server. ``auto`` uses
uvloop when it can be imported and asyncio's own loop otherwise; ``uvloop``
insists (a ConfigError, exit code 2, when it is missing); ``asyncio`` never
uses it. What uvloop gives is measured in docs/performance.md.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from service.config import ConfigError

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def resolve(choice: str) -> tuple[str, LoopFactory | None]:
    """(the loop's name, its factory) for ``auto``, ``asyncio`` or ``uvloop``.

    The factory is None for asyncio's default loop."""
    if choice == "asyncio":
        return "asyncio", None
    if choice not in ("auto", "uvloop"):
        raise ConfigError("MC_EVENT_LOOP/--event-loop must be auto, asyncio or uvloop")
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "MC_EVENT_LOOP=uvloop but uvloop is not installed "
                "(pip install 'message-committer[uvloop]')"
            ) from None
        return "asyncio", None
    factory: LoopFactory = uvloop.new_event_loop
    return "uvloop", factory


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    try:
        _, factory = resolve(choice)
    except BaseException:
        main.close()  # never awaited: say so quietly instead of a RuntimeWarning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this coroutine runs on."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
