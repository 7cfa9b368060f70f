"""How the conformance suite opens a backend, whatever the backend is.

A harness belongs to one test. ``open`` returns a backend over that test's
own namespace; opening again after ``close`` must see the same durable data
(that is how the suite checks a restart). ``identity_form="whole"`` opens a
backend that writes the legacy whole identity (``QIMC``), as versions before
the digest form did; ``delivery`` sets mailbox retention and the relay's
outbox settings.
"""

from __future__ import annotations

import abc
from typing import Literal

from service.domain.delivery import DeliverySettings
from service.domain.ports import Backend, Clock, StoreSettings

IdentityForm = Literal["digest", "whole"]


class Harness(abc.ABC):
    """Opens backends of one kind for one test; closes them all at the end."""

    name: str = "?"
    durable: bool = True

    def __init__(self) -> None:
        self._opened: list[Backend] = []

    async def open(
        self,
        *,
        clock: Clock | None = None,
        settings: StoreSettings | None = None,
        identity_form: IdentityForm = "digest",
        delivery: DeliverySettings | None = None,
    ) -> Backend:
        backend = await self._open(
            clock=clock, settings=settings, identity_form=identity_form, delivery=delivery
        )
        self._opened.append(backend)
        return backend

    @abc.abstractmethod
    async def _open(
        self,
        *,
        clock: Clock | None,
        settings: StoreSettings | None,
        identity_form: IdentityForm,
        delivery: DeliverySettings | None = None,
    ) -> Backend:
        """Open a backend on this test's namespace."""

    async def close_all(self) -> None:
        while self._opened:
            await self._opened.pop().close()
