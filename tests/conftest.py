"""Test-wide plugins: the real servers (redis-server, a CQL node, clusters, toxiproxy) the
suites start."""

pytest_plugins = [
    "tests.servers.redis_server",
    "tests.servers.cql_server",
    "tests.servers.cql_cluster",
    "tests.servers.redis_topologies",
    "tests.servers.toxiproxy_server",
]
