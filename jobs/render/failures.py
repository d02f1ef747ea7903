"""What follows a claimed batch that did not reach the store: what its error decides (jobs.render.attempts.decide:
retry, fail now, hand back), or what the reason it was stopped from outside asks (jobs.render.keeper.Stop). Each
video is charged the seconds its share took, whatever follows."""

from __future__ import annotations

import logging

from typing_extensions import assert_never

from faults import Decision
from jobs.claims import leases
from jobs.claims.claims import Claim, ClaimedUnit
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.render.attempts import charge_released, decide, error_text, fail_now, retry, tally
from jobs.render.finisher import BatchResult
from jobs.render.keeper import Stop
from jobs.settings import Settings

log = logging.getLogger(__name__)


def failed_all(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit], exc: Exception,
               adopted: int, meter: Meter, spent: float = 0.0) -> BatchResult:
    """The batch's model would not load or its render raised: what follows for its videos is what the error decides.
    The `spent` seconds each video's share took are charged to it (kind "retry") whatever the decision."""
    error = error_text(exc)
    match decide(exc):
        case Decision.RETRY:
            return retry_all(settings, factory, claim, todo, error, adopted, meter, spent)
        case Decision.FAIL_NOW if len(todo) > 1:
            # One video of several may be the cause (its picture, say): each goes back to be claimed alone, with no
            # attempt counted, and fails at once only if it fails alone (one attempt for each video, as it would
            # have spent alone).
            return hand_back(factory, claim, todo, "retry", adopted, meter, spent, solo=True)
        case Decision.FAIL_NOW:
            (unit,) = todo
            _, failed = tally([fail_now(factory, unit, error, meter, spent=spent)])
            return BatchResult(len(claim.units), adopted, failed=failed)
        case Decision.HAND_BACK:  # stopped from outside (a RenderInterrupted is handled before: interrupted)
            return hand_back(factory, claim, todo, "interrupted", adopted, meter, spent)
        case decision:
            assert_never(decision)


def retry_all(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit], error: str, adopted: int,
              meter: Meter, spent: float = 0.0) -> BatchResult:
    # A batch of several that failed is split: each video retries alone, so one bad video cannot fail the rest.
    retried, failed = tally(retry(settings, factory, u, error, meter, solo=len(todo) > 1, spent=spent) for u in todo)
    return BatchResult(len(claim.units), adopted, retried, failed)


def hand_back(factory: Factory, claim: Claim, todo: list[ClaimedUnit], kind: str, adopted: int, meter: Meter,
              spent: float, *, solo: bool = False) -> BatchResult:
    """Give the units back with no attempt counted (`solo`: each to be claimed alone), charging each the `spent`
    seconds as `kind`."""
    for unit in todo:
        charge_released(factory, unit, kind, spent, meter)
    return BatchResult(len(claim.units), adopted, released=sum(leases.release(factory, u, solo=solo) for u in todo))


def interrupted(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit], reason: Stop,
                limit: float, adopted: int, meter: Meter, spent: float = 0.0) -> BatchResult:
    match reason:
        case Stop.TIME_LIMIT:
            return retry_all(settings, factory, claim, todo, f"batch time limit of {limit:.0f} s exceeded",
                             adopted, meter, spent)
        case Stop.LEASE_LOST:  # another worker owns these units now; every write from here would be refused
            return BatchResult(len(claim.units), adopted)
        case Stop.CANCELLED | Stop.PREEMPTED | Stop.INTERRUPTED:
            # The seconds were spent on these videos all the same: charged as "cancelled", "preempted" or
            # "interrupted". The units go back at once, with no attempt counted (a cancelled run's become
            # cancelled), so another worker or a rerun takes them now rather than after their leases; a long
            # video keeps the chunks it finished.
            for unit in todo:
                charge_released(factory, unit, reason.value, spent, meter)
            released = sum(leases.release(factory, u) for u in todo)
            if reason is not Stop.CANCELLED:
                log.warning("stopped the batch of %d (%s): %d handed back", len(todo), reason.value, released)
            return BatchResult(len(claim.units), adopted, released=released)
        case _:
            assert_never(reason)
