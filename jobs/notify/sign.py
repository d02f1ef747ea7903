"""The signature on every delivery, the way Stripe signs its webhooks: HMAC-SHA256, keyed with
REELBATCH_WEBHOOK_SECRET, over `{timestamp}.{body}`, sent as `Reelbatch-Signature: t={timestamp},v1={hex}`.

The timestamp is inside the MAC, so a receiver that refuses timestamps older than a few minutes (TOLERANCE_S, Stripe's
default) cannot be fed a recorded delivery again later; the delivery id in the body (and the Reelbatch-Delivery
header) lets it drop a repeat within that window. docs/NOTIFICATIONS.md shows a receiver's check in ten lines.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "Reelbatch-Signature"
DELIVERY_HEADER = "Reelbatch-Delivery"
ATTEMPT_HEADER = "Reelbatch-Attempt"
# Stripe's libraries refuse a signature more than 5 minutes from the receiver's clock by default.
TOLERANCE_S = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The Reelbatch-Signature header's value for `body` sent at `timestamp` (Unix seconds)."""
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode("ascii") + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, now: float, tolerance_s: float = TOLERANCE_S) -> bool:
    """A receiver's check: a v1 signature of `body` at the header's timestamp, within `tolerance_s` of `now`."""
    fields = [part.partition("=") for part in header.split(",")]
    stamps = [value for key, _, value in fields if key == "t"]
    if len(stamps) != 1 or not stamps[0].isdigit() or abs(now - int(stamps[0])) > tolerance_s:
        return False
    expected = signature(secret, int(stamps[0]), body).rpartition("v1=")[2]
    return any(key == "v1" and hmac.compare_digest(value, expected) for key, _, value in fields)
