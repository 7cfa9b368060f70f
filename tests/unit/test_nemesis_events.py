"""The nemesis reads each replica's backend events from its /metrics page."""

from __future__ import annotations

from toolkit.nemesis.replicas import backend_events

PAGE = """# HELP message_committer_backend_events_total What a backend noticed.
# TYPE message_committer_backend_events_total counter
message_committer_backend_events_total{kind="direct_timeout"} 7.0
message_committer_backend_events_total{kind="direct_path_refused"} 0.0
message_committer_backend_requests_total{kind="lwt"} 123.0
"""


def test_only_the_backend_events_counter_is_read() -> None:
    events = backend_events(PAGE)
    assert events == {"direct_timeout": 7, "direct_path_refused": 0}


def test_a_page_without_the_counter_has_no_events() -> None:
    assert backend_events("process_cpu_seconds_total 1.5\n") == {}
