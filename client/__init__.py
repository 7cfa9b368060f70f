"""The client runtime of message-committer (seed 001, DESIGN §11).

``ClientRuntime`` over a ``LocalStore`` (SQLite, ``open_local_store``) and a
``Connector`` (gRPC, ``GrpcConnector``). See ``client.runtime`` for the cycle
and ``client.events`` for what a host reads. The fault points the test
campaigns drive (``client.faults``) are not part of this surface.
"""

from client.config import RuntimeConfig
from client.errors import (
    AccountMismatch,
    AlreadyConnected,
    ClientRuntimeError,
    ConnectRequired,
    DuplicateClientMessageId,
    InvalidArgument,
    InvalidMailboxPage,
    LocalSchemaError,
    LocalStoreBusy,
    LocalStoreFailure,
    Offline,
    RebuildNotAllowed,
    RuntimeStopped,
    ServerRejected,
)
from client.events import (
    ClientEvent,
    ConnectionChanged,
    CursorExpired,
    EventsDropped,
    LocalStoreReset,
    MessagesAdded,
    RebuildFinished,
    RebuildStarted,
    SendConfirmed,
    SendFailed,
)
from client.model import (
    ConnectRequest,
    ExpiredCursor,
    LocalMessage,
    MailboxCursor,
    MailboxPage,
    MemberPageRequest,
    Origin,
    PendingSend,
    RebuildPlan,
    SendMessage,
)
from client.runtime import ClientRuntime
from client.sqlite import SqliteLocalStore, in_memory_store_for_test, open_local_store
from client.state import ConnectionState
from client.store import LocalStore
from client.transport import CallTimeouts, Connector, GrpcConnector, ServerApi
from service.domain.model import (  # the service's own types a host reads and writes
    CommittedMessage,
    Direction,
    HistoryQuery,
    MessageContent,
    MessageRecord,
    MessageType,
)

__all__ = [
    "AccountMismatch",
    "AlreadyConnected",
    "CallTimeouts",
    "ClientEvent",
    "ClientRuntime",
    "ClientRuntimeError",
    "CommittedMessage",
    "ConnectRequest",
    "ConnectRequired",
    "ConnectionChanged",
    "ConnectionState",
    "Connector",
    "CursorExpired",
    "Direction",
    "DuplicateClientMessageId",
    "EventsDropped",
    "ExpiredCursor",
    "GrpcConnector",
    "HistoryQuery",
    "InvalidArgument",
    "InvalidMailboxPage",
    "LocalMessage",
    "LocalSchemaError",
    "LocalStore",
    "LocalStoreBusy",
    "LocalStoreFailure",
    "LocalStoreReset",
    "MailboxCursor",
    "MailboxPage",
    "MemberPageRequest",
    "MessageContent",
    "MessageRecord",
    "MessageType",
    "MessagesAdded",
    "Offline",
    "Origin",
    "PendingSend",
    "RebuildFinished",
    "RebuildNotAllowed",
    "RebuildPlan",
    "RebuildStarted",
    "RuntimeConfig",
    "RuntimeStopped",
    "SendConfirmed",
    "SendFailed",
    "SendMessage",
    "ServerApi",
    "ServerRejected",
    "SqliteLocalStore",
    "in_memory_store_for_test",
    "open_local_store",
]
