"""MC_SCYLLA_NODE_PROXIES: NODE=HOST:PORT routes, parsed once, refused without the value."""

from __future__ import annotations

import pytest

from service import config
from service.config import ConfigError


def test_routes_are_parsed_per_node() -> None:
    loaded = config.load(
        {"backend": "scylla", "scylla_contact_points": "10.0.0.1"},
        {"MC_SCYLLA_NODE_PROXIES": "10.0.0.1=127.0.0.1:21001, 10.0.0.2=127.0.0.1:21002"},
    )
    assert loaded.scylla_node_routes() == {
        "10.0.0.1": ("127.0.0.1", 21001),
        "10.0.0.2": ("127.0.0.1", 21002),
    }
    assert config.load({"backend": "memory"}, {}).scylla_node_routes() == {}


@pytest.mark.parametrize("value", ["10.0.0.1", "=127.0.0.1:1", "10.0.0.1=127.0.0.1", "a=b:x"])
def test_a_malformed_route_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.load({"backend": "memory"}, {"MC_SCYLLA_NODE_PROXIES": value})
    assert "MC_SCYLLA_NODE_PROXIES" in str(err.value)
    assert value not in str(err.value)
