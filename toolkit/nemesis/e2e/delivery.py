"""Exactly once, with the ACK's coordinates, equal to History: the devices' side.

The rules of the client campaign's process mode (``client_campaign.proc_check``:
lost, duplicated, wrongly confirmed, wrong refusal, stuck, phantom: a send a device
persisted must end confirmed or refused with a code its situation allows, and every
message committed while a user was surely a member must be, once, in every device
of that user), plus one more rule here:

==================  ===========================================================
coordinates         a message a device holds at another seq than History's
                    record of it (the store must equal History)
==================  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.domain.model import MessageRecord
from toolkit.client_campaign.proc_check import Ledger, Verdict
from toolkit.client_campaign.proc_check import check as check_devices

KINDS = ("lost", "duplicated", "wrongly_confirmed", "wrong_refusal", "stuck", "phantom")


@dataclass
class DeliveryFindings:
    verdict: Verdict
    held: int = 0
    """(device, message) pairs compared with History."""
    anomalies: list[str] = field(default_factory=list)


def check(
    ledger: Ledger,
    history: dict[str, list[MessageRecord]],
    devices: list[Any],
    statuses: dict[tuple[str, str], dict[str, Any]],
) -> DeliveryFindings:
    verdict = check_devices(ledger, history, devices, statuses)
    found = DeliveryFindings(verdict, anomalies=[p for p in verdict.problems])
    server = {(c, r.message_id): r.seq for c, records in history.items() for r in records}
    for (user, device), status in sorted(statuses.items()):
        for conversation, seqs in sorted(status.get("seqs", {}).items()):
            for message_id, seq in sorted(seqs.items()):
                found.held += 1
                want = server.get((conversation, message_id))
                if want is not None and want != seq:
                    found.anomalies.append(
                        f"coordinates: {user}/{device} holds {message_id} of {conversation}"
                        f" at seq {seq}, History at {want}"
                    )
    if verdict.settled_in_s < 0 or verdict.broken:
        found.anomalies.append("stuck: the devices did not settle")
    return found
