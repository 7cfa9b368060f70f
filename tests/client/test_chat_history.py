"""The chat's ``/history`` command pages back past records the user may not read
(History's reading rule names them in ``hidden_seqs``): a page of hidden records
only moves it on instead of asking for the same page again."""

from __future__ import annotations

import argparse
from typing import cast

import pytest

from client import ClientRuntime
from client.chat import Chat
from service.domain.model import (
    Direction,
    HistoryPage,
    HistoryQuery,
    MessageContent,
    MessageRecord,
    MessageType,
)


def _record(seq: int) -> MessageRecord:
    content = MessageContent(MessageType.TEXT, b"hi")
    return MessageRecord("t", "c", seq, f"m{seq}", "bob", "d", f"k{seq}", content, (), "", 1)


class History:
    """A runtime whose History hides 3-4 (sent while the user was out) and ends at 1."""

    def __init__(self) -> None:
        self.anchors: list[int] = []

    async def pull_history(self, query: HistoryQuery) -> HistoryPage:
        self.anchors.append(query.anchor_seq)
        pages = {
            5: HistoryPage("c", Direction.BACKWARD, 5, 0, (), 1, 9, 3, hidden_seqs=(4, 3)),
            3: HistoryPage("c", Direction.BACKWARD, 3, 0, (_record(2), _record(1)), 1, 9),
        }
        return pages[query.anchor_seq]


async def test_older_pages_past_a_page_of_hidden_records(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat = Chat(argparse.Namespace(conversation="c", user="alice"))
    chat.oldest = 5
    runtime = History()
    await chat.older(cast(ClientRuntime, runtime))
    await chat.older(cast(ClientRuntime, runtime))
    assert runtime.anchors == [5, 3]  # on main: [5, 5], the same hidden page again
    assert chat.oldest == 1
    assert "#2 bob" in capsys.readouterr().out
