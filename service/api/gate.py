"""The one fail-closed gate: writes are refused while the backend is unsafe to write.

The readiness probe (``service.health``) closes the gate when the backend
refuses for a reason an operator must fix, the same reasons that turn health
NOT_SERVING and stay so until fixed: a wrong eviction policy set at run time
or a lost deployment identity (Redis), a clock beyond the bound (Scylla).
Those are ``StoreMisconfigured`` and ``StoreWiped``. A backend that merely
does not answer leaves the gate as it was (the write fails on its own; a
closed gate stays closed until a probe succeeds). A successful probe opens it.

While closed, every write RPC (``WRITE_METHODS``) answers UNAVAILABLE, reason
``FAIL_CLOSED``, with the probe's reason (a class name and a fixed operator
sentence, never backend text), before it reaches the committer. Reads stay
served. The cost per request is one attribute read: the StatusInterceptor
(``service.api.interceptor``) checks it in the wrapper it makes once per write
method; the flag is set by the probe, never computed per request. The recovery
loop obeys the same gate.
"""

from __future__ import annotations

from service.api.errors import FailClosed
from service.domain.errors import StoreMisconfigured, StoreWiped

FAIL_CLOSED_CAUSES: tuple[type[Exception], ...] = (StoreMisconfigured, StoreWiped)

WRITE_METHODS = frozenset(
    {
        "/message_committer.v1.MessageCommitterService/Commit",
        "/message_committer.v1.MessageCommitterService/Resume",
        "/message_committer.v1.MessageCommitterService/ResumeExisting",
        "/message_committer.v1.MessageCommitterService/RecoverDue",
        "/message_committer.v1.ConversationMembershipService/CreateConversation",
        "/message_committer.v1.ConversationMembershipService/AddMembers",
        "/message_committer.v1.ConversationMembershipService/RemoveMembers",
        "/message_committer.v1.RecoveryAdminService/RetryQuarantined",
    }
)


class WriteGate:
    """The cached flag: empty ``refusal`` is open."""

    def __init__(self) -> None:
        self.refusal = ""

    def observe(self, cause: BaseException | None, reason: str) -> None:
        """The probe's outcome: None is success (open); a fail-closed cause closes
        with ``reason``; any other failure leaves the gate as it was."""
        if cause is None:
            self.refusal = ""
        elif isinstance(cause, FAIL_CLOSED_CAUSES):
            self.refusal = reason

    def check(self) -> None:
        """Raise FailClosed while closed."""
        if self.refusal:
            raise FailClosed(f"writes refused until the backend is fixed: {self.refusal}")
