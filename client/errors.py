"""The errors the client runtime raises to its host.

::

    ClientRuntimeError                  every error of this package
    ├── ConnectRequired                 a network command before ``connect``
    ├── AlreadyConnected                ``connect`` called a second time
    ├── InvalidArgument                 a request breaks a rule; nothing was stored
    ├── DuplicateClientMessageId        the cmid is pending for a different send
    ├── InvalidMailboxPage              a page that is not the next complete groups
    ├── RebuildNotAllowed               begin/finish_rebuild outside a CursorExpired
    ├── Offline                         a pull while no server connection is up
    ├── ServerRejected                  the server refused a pull (wraps its error)
    ├── RuntimeStopped                  the runtime was closed, or crashed
    └── LocalStoreFailure               the local database failed
        ├── AccountMismatch             the store belongs to another account
        ├── LocalStoreBusy              another process has the store open
        └── LocalSchemaError            unreadable, too new, or a failed migration

Texts name fields, rules and error classes; never message bodies, and never
the server address.
"""

from __future__ import annotations


class ClientRuntimeError(Exception):
    """Root of every error the client runtime raises."""


class ConnectRequired(ClientRuntimeError):
    """A network command (send, pull, rebuild) was called before ``connect``.

    The runtime never connects on its own and never picks a default account.
    """


class AlreadyConnected(ClientRuntimeError):
    """``connect`` was called twice on one runtime."""


class InvalidArgument(ClientRuntimeError):
    """A request breaks a rule (ids, content, mentions, another account's query);
    nothing was stored or sent."""


class DuplicateClientMessageId(ClientRuntimeError):
    """The client message id is already pending for a different send."""


class InvalidMailboxPage(ClientRuntimeError):
    """A mailbox page that does not continue the stored cursor with complete groups
    (another lane or epoch, a gap, a split group); nothing was applied."""


class RebuildNotAllowed(ClientRuntimeError):
    """``begin_rebuild``/``finish_rebuild`` without the CursorExpired that starts one."""


class Offline(ClientRuntimeError):
    """A pull was asked for while the runtime has no server connection."""


class ServerRejected(ClientRuntimeError):
    """The server answered a pull with an error; ``cause`` is its class."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class RuntimeStopped(ClientRuntimeError):
    """The runtime was closed, or stopped at an injected crash."""


class LocalStoreFailure(ClientRuntimeError):
    """The local database failed (I/O, corruption, a broken invariant)."""


class AccountMismatch(LocalStoreFailure):
    """The local store was bound to another (tenant, user, device) on first connect."""


class LocalStoreBusy(LocalStoreFailure):
    """Another runtime (another process) has this local store open."""


class LocalSchemaError(LocalStoreFailure):
    """The local schema could not be used: unreadable, newer than this runtime,
    or a migration failed. Opening the store resets it (``LocalStoreReset``)."""


class LocalStoreCorrupt(LocalSchemaError):
    """The local database is damaged (a corrupt page, an undecodable row): the
    store is reset the same way as on open, keeping the pending sends it can read."""
