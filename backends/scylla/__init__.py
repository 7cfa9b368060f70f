"""The ScyllaDB backend (production): see docs/scylla.md.

``open_scylla_backend`` wires the three ports over one driver session;
``backends.scylla.migrate`` creates and upgrades the schema.
"""

from backends.scylla.backend import open_scylla_backend

__all__ = ["open_scylla_backend"]
