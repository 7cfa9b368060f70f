"""The server's whole history of a conversation, as both campaign modes check it."""

from __future__ import annotations

from service.client import CommitClient
from service.domain.model import Direction, HistoryQuery, MessageRecord

PAGE = 200
MAX_PAGES = 10_000


async def whole_history(
    client: CommitClient, tenant: str, conversation: str, actor: str
) -> list[MessageRecord]:
    """Every record of ``conversation`` in seq order, read as ``actor`` (a member)."""
    records: list[MessageRecord] = []
    anchor = 0
    for _ in range(MAX_PAGES):
        query = HistoryQuery(tenant, conversation, actor, Direction.FORWARD, anchor, PAGE)
        page = await client.history(query)
        records += page.records
        anchor = page.next_anchor
        if not anchor:
            return records
    raise RuntimeError(f"the history of {conversation} did not end within {MAX_PAGES} pages")
