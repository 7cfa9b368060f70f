"""The delivery checker judges each message's recipients by the membership version
its delivery was frozen at (DESIGN §9), not by wall-clock windows around the
membership changes: synthetic histories around an add, a removal and a loss
inside the old slack window; and the versions as the inboxes' entries carry them
(``frozen.FrozenVersions``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.memory import open_memory_backend
from backends.memory.state import MemoryState
from service.domain.mailbox import Mailbox
from service.domain.model import MessageContent, MessageRecord, MessageType
from service.domain.ports import ManualClock
from tests.conformance.relay_support import drain, ports
from tests.support import committer, send, unique
from toolkit.client_campaign.proc_check import Ledger
from toolkit.nemesis.e2e import delivery, frozen
from toolkit.nemesis.e2e.frozen import FrozenVersions


@dataclass
class Dev:
    user: str
    device: str
    events: list[dict[str, Any]] = field(default_factory=list)


def message(sender: str, ts_s: float) -> MessageRecord:
    content = MessageContent(MessageType.TEXT, b"hello")
    ts_ms = int(ts_s * 1000)
    return MessageRecord("acme", "c0", 1, "m1", sender, "a", "k1", content, (), "", ts_ms)


def judge(ledger: Ledger, record: MessageRecord, u1_holds: bool) -> list[str]:
    """u0 (the sender, always a member) holds ``record`` on both devices; u1's
    devices hold it when ``u1_holds``."""
    held = {"held": {"c0": ["m1"]}, "seqs": {"c0": {"m1": 1}}, "pending": [], "parked": []}
    lacks = {"held": {"c0": []}, "seqs": {"c0": {}}, "pending": [], "parked": []}
    devices = [Dev(u, d, [{"ev": "started"}]) for u in ("u0", "u1") for d in ("a", "b")]
    statuses = {(d.user, d.device): held for d in devices}
    if not u1_holds:
        statuses[("u1", "a")] = statuses[("u1", "b")] = lacks
    return delivery.check(ledger, {"c0": [record]}, devices, statuses).anomalies


def test_a_message_frozen_before_an_add_is_not_required_at_the_added_user() -> None:
    """Its ACK (and server clock) came after the add returned: the windows say u1 is
    a recipient; its version says it is not."""
    ledger = Ledger(initial={"c0": {"u0"}})
    ledger.membership("c0", "u1", True, 10.0, 10.1, version=3)
    ledger.frozen["m1"] = 2
    assert judge(ledger, message("u0", 10.5), u1_holds=False) == []


def test_a_message_frozen_after_a_removal_is_not_required_at_the_removed_user() -> None:
    """Stamped before the removal began (a server clock behind), frozen after it:
    u1 (back at the end) was no recipient."""
    ledger = Ledger(initial={"c0": {"u0", "u1"}})
    ledger.membership("c0", "u1", False, 10.0, 10.1, version=3)
    ledger.membership("c0", "u1", True, 20.0, 20.1, version=5)
    ledger.frozen["m1"] = 4
    assert judge(ledger, message("u0", 9.0), u1_holds=False) == []


def test_a_loss_inside_the_old_slack_window_is_caught() -> None:
    """Frozen at version 2, while u1 was a member, stamped inside the window of its
    removal (version 3): the windows do not judge it; its version does."""
    ledger = Ledger(initial={"c0": {"u0", "u1"}})
    ledger.membership("c0", "u1", False, 10.0, 10.1, version=3)
    ledger.membership("c0", "u1", True, 20.0, 20.1, version=4)
    ledger.frozen["m1"] = 2
    found = judge(ledger, message("u0", 10.08), u1_holds=False)
    assert sorted(found) == ["lost: u1/a lacks m1 of c0", "lost: u1/b lacks m1 of c0"]
    assert judge(ledger, message("u0", 10.08), u1_holds=True) == []


def test_a_message_frozen_while_its_sender_was_no_member_is_a_wrong_admission() -> None:
    ledger = Ledger(initial={"c0": {"u0", "u1"}})
    ledger.membership("c0", "u1", False, 10.0, 10.1, version=3)
    ledger.membership("c0", "u1", True, 20.0, 20.1, version=5)
    ledger.frozen["m1"] = 4
    found = judge(ledger, message("u1", 30.0), u1_holds=True)  # windows: a member then
    assert found == ["wrong_refusal: k1 committed while u1 was not a member"]


def test_a_change_whose_answer_was_lost_leaves_only_its_user_uncertain() -> None:
    """Removal of u1 with a lost answer, then a re-add answered at version 6: at
    versions before 6 u1 is not judged; from 6 on it is a recipient again."""
    ledger = Ledger(initial={"c0": {"u0", "u1"}})
    ledger.membership("c0", "u1", False, 10.0, float("inf"), version=None)
    ledger.membership("c0", "u1", True, 20.0, 20.1, version=6)
    assert ledger.member_at_version("c0", "u1", 5) is None
    assert ledger.member_at_version("c0", "u1", 6) is True
    assert ledger.member_at_version("c0", "u0", 5) is True
    ledger.frozen["m1"] = 5
    assert judge(ledger, message("u0", 30.0), u1_holds=False) == []
    ledger.frozen["m1"] = 7
    assert len(judge(ledger, message("u0", 15.0), u1_holds=False)) == 2


def test_a_message_without_a_known_version_keeps_the_windows() -> None:
    """No mailbox entry said its version (a client campaign, or every entry gone
    with new epochs): judged by the windows as before."""
    ledger = Ledger(initial={"c0": {"u0"}})
    ledger.membership("c0", "u1", True, 10.0, 10.1, version=3)
    assert len(judge(ledger, message("u0", 10.5), u1_holds=False)) == 2
    assert judge(ledger, message("u0", 9.0), u1_holds=False) == []


# --- where the versions come from: the inboxes' entries --------------------------------


async def test_the_versions_read_from_the_inboxes_are_the_ones_each_delivery_froze(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Memory backend, the relay drained: m0 is frozen at the creation's version,
    m1 at the add's (carol's inbox holds only m1); paged one entry at a time, and
    what a new epoch dropped stays known."""
    monkeypatch.setattr(frozen, "PAGE", 1)
    clock = ManualClock()
    backend = open_memory_backend(MemoryState(), clock=clock)
    tenant = unique("t")
    created = await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    m0 = await committer(backend, clock).commit_send(send(tenant, "c1"))
    added = await backend.membership.add_members(tenant, "c1", ["carol"])
    m1 = await committer(backend, clock).commit_send(send(tenant, "c1"))
    await drain(backend, "relay-a", clock)
    store = ports(backend).mailbox
    versions = FrozenVersions()
    await versions.read(store, tenant, ["alice", "bob", "carol"])
    assert created.version < added.version
    assert versions.seen == {m0.message_id: {created.version}, m1.message_id: {added.version}}
    assert (versions.reads, versions.failed, versions.anomalies()) == (3, 0, [])
    await store.new_epoch(Mailbox.inbox(tenant, "alice"))
    await versions.read(store, tenant, ["alice"])
    ledger = Ledger(initial={"c1": {"alice", "bob"}})
    ledger.membership("c1", "carol", True, 0.0, 0.0, version=added.version)
    versions.into(ledger)
    assert ledger.frozen == {m0.message_id: created.version, m1.message_id: added.version}
    assert ledger.member_at_version("c1", "carol", ledger.frozen[m0.message_id]) is False
    assert ledger.member_at_version("c1", "carol", ledger.frozen[m1.message_id]) is True


def test_entries_of_one_message_at_two_versions_are_a_frozen_version_anomaly() -> None:
    versions = FrozenVersions()
    for message_id, version in [("m1", 2), ("m1", 2), ("m2", 2), ("m2", 3), ("m3", 0)]:
        versions.add(message_id, version)
    assert versions.anomalies() == ["frozen-version: m2 has entries at membership versions [2, 3]"]
    ledger = Ledger(initial={})
    versions.into(ledger)
    assert ledger.frozen == {"m1": 2}  # m2 by the windows; m3 (release 1) has none
