"""The LocalStore on SQLite (WAL, versioned migrations, a reset that keeps pending sends)."""

from client.sqlite.store import SqliteLocalStore, in_memory_store_for_test, open_local_store

__all__ = ["SqliteLocalStore", "in_memory_store_for_test", "open_local_store"]
