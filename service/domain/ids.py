"""Identifier rules.

Every identifier the service accepts is a short ASCII token. The rules are
deliberately strict so that ids are safe in logs, metric labels (never used
as labels, but still), storage keys and URLs:

* tenant, user (sender, member, mention), device, conversation and message
  ids: 1 to 128 characters from ``A-Z a-z 0-9 . _ ~ : -``;
* the ClientMessageId (cmid): 1 to 64 characters from ``A-Z a-z 0-9 . _ ~ -``
  (URL-unreserved; a UUID in any usual spelling fits).

Storage layers must still encode ids when they build keys (see each backend);
the character rules are for people, not a substitute for encoding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.domain.errors import InvalidClientMessageId, InvalidRequest

MAX_ID_LENGTH = 128
MAX_CMID_LENGTH = 64

_ID_RE = re.compile(r"[A-Za-z0-9._~:\-]{1,128}")
_CMID_RE = re.compile(r"[A-Za-z0-9._~\-]{1,64}")


def check_id(field: str, value: str) -> str:
    """Return ``value`` if it is a valid identifier, else raise InvalidRequest.

    The error names the field and the rule, never the value (it may be junk
    the caller should not see echoed into logs).
    """
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidRequest(
            f"{field} must be 1-{MAX_ID_LENGTH} characters from A-Z a-z 0-9 . _ ~ : -"
        )
    return value


def check_cmid(value: str) -> str:
    """Return ``value`` if it is a valid ClientMessageId, else raise."""
    if not isinstance(value, str) or not _CMID_RE.fullmatch(value):
        raise InvalidClientMessageId(
            f"client_message_id must be 1-{MAX_CMID_LENGTH} characters from A-Z a-z 0-9 . _ ~ -"
        )
    return value


@dataclass(frozen=True, slots=True)
class CommitKey:
    """The idempotency key of one send: (tenant, sender, cmid)."""

    tenant: str
    sender: str
    cmid: str

    def validate(self) -> CommitKey:
        check_id("tenant", self.tenant)
        check_id("sender", self.sender)
        check_cmid(self.cmid)
        return self

    def __str__(self) -> str:  # safe for logs: ids only, never content
        return f"{self.tenant}/{self.sender}/{self.cmid}"
