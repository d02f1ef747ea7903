"""Sending: claim what is due, sign it, POST it, record the attempt. Every worker's sweeper calls `deliver_due` each
tick, and the process that notices a run finish calls it at once for that notification (jobs.notify.finished).

The POST is Python's own urllib: one request, a 10 s timeout, no redirects followed (a redirect could lead outside
the allowed prefixes; it counts as a refusal). A 2xx answer is accepted; any other answer, a timeout or a refused
connection is a failed attempt, retried after the backoff.
"""

from __future__ import annotations

import http.client
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime

from typing_extensions import assert_never

from jobs.db.base import utcnow
from jobs.db.queries import Factory
from jobs.notify import outbox
from jobs.notify.outbox import Attempt, Due
from jobs.notify.sign import ATTEMPT_HEADER, DELIVERY_HEADER, SIGNATURE_HEADER, signature
from jobs.observe.identity import worker_id
from jobs.settings import Settings

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
USER_AGENT = "reelbatch-webhook/1"


@dataclass(frozen=True)
class Accepted:
    status: int


@dataclass(frozen=True)
class Refused:
    """The receiver answered, but not with a 2xx."""

    status: int
    detail: str


@dataclass(frozen=True)
class Failed:
    """No answer: refused connection, timeout, TLS failure, or nothing to sign with."""

    error: str


Outcome = Accepted | Refused | Failed


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # urllib then raises HTTPError with the 3xx, recorded as a refusal


_opener = urllib.request.build_opener(_NoRedirects)


def post(url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with _opener.open(request, timeout=TIMEOUT_S) as response:
            response.read(4096)
            status = response.status
    except urllib.error.HTTPError as exc:
        detail = exc.read(200).decode("utf-8", "replace") if exc.fp else ""
        return Refused(exc.code, f"{exc.code} {exc.reason}" + (f": {detail}" if detail else ""))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        return Failed(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}")
    return Accepted(status) if 200 <= status < 300 else Refused(status, f"{status}")


def attempt_once(settings: Settings, due: Due) -> Outcome:
    """Sign and POST one claimed notification (nothing is sent without a key to sign with)."""
    if settings.webhooks.secret is None:
        return Failed(f"REELBATCH_WEBHOOK_SECRET is not set in {worker_id()}: not sent")
    data = due.body.encode("utf-8")
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, DELIVERY_HEADER: due.key,
               ATTEMPT_HEADER: str(due.number), SIGNATURE_HEADER: signature(settings.webhooks.secret, int(time.time()),
                                                                            data)}
    return post(due.url, data, headers)


def deliver_due(settings: Settings, factory: Factory, *, now: datetime | None = None, only: int | None = None,
                limit: int = 5) -> list[str]:
    """Send what is due (or just notification `only`); returns each one's state after its attempt. `now` is the
    moment due-ness, leases and backoff are reckoned from (a test's clock); the signature always carries real time."""
    owner = worker_id()
    results = []
    for due in outbox.claim_due(factory, owner, now or utcnow(), only=only, limit=limit):
        started, t0 = utcnow(), time.perf_counter()
        outcome = attempt_once(settings, due)
        duration = time.perf_counter() - t0
        match outcome:
            case Accepted(status):
                attempt = Attempt(due.number, owner, started, duration, status, None, True)
            case Refused(status, detail):
                attempt = Attempt(due.number, owner, started, duration, status, detail, False)
            case Failed(error):
                attempt = Attempt(due.number, owner, started, duration, None, error, False)
            case _:
                assert_never(outcome)
        state = outbox.record_attempt(factory, due, attempt, first_backoff_s=settings.webhooks.backoff_s,
                                      now=now or utcnow())
        # The URL is left out: some receivers (chat webhooks) carry their secret in it.
        log.log(logging.INFO if attempt.accepted else logging.WARNING, "webhook delivery %s attempt %d: %s (%s)",
                due.key, due.number, attempt.status_code or attempt.error, state)
        results.append(state)
    return results
