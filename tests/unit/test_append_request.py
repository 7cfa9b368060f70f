"""``AppendRequest.with_floor`` is ``dataclasses.replace(request, floor=...)``
built directly (the relay makes one per mailbox per step; issue 27)."""

from __future__ import annotations

import dataclasses

from service.domain.delivery import AppendRequest
from service.domain.lane_marks import LaneMark
from service.domain.mailbox import Mailbox


def test_with_floor_is_replace_of_the_floor_alone() -> None:
    request = AppendRequest(Mailbox.inbox("t", "u"), ())
    mark = LaneMark(2, 5)
    assert request.with_floor(mark) == dataclasses.replace(request, floor=mark)
    assert request.with_floor(mark).with_floor(None) == request


def test_with_floor_knows_every_field() -> None:
    """A field added to AppendRequest must be carried by ``with_floor`` too."""
    names = [f.name for f in dataclasses.fields(AppendRequest)]
    assert names == ["mailbox", "items", "floor"]
