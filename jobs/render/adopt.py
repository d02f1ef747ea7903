"""An earlier attempt's upload adopted: a video whose attempt stored its MP4 but died before recording it is recorded
from the object at its key (found by the checksum recorded before the upload), not rendered or stored again. Asked
at the claim (adopt_earlier_uploads, jobs.render.batch) and on a conflict at the upload (jobs.render.store)."""

from __future__ import annotations

import logging

from jobs.claims.claims import Claim, ClaimedUnit
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.manifest import keys
from jobs.render import record
from jobs.render.attempts import error_text
from jobs.render.chunks import drop_checkpoints
from jobs.render.posters import adopted_poster
from jobs.render.record import VideoOutput
from jobs.settings import Settings
from storage.stores import StoredObject, StoreError

log = logging.getLogger(__name__)


def earlier_upload(unit: ClaimedUnit) -> StoredObject | None:
    """The object at the video's key if it is the one an earlier attempt recorded just before uploading it (its
    checksum is the unit's upload_sha256): that attempt's MP4, to adopt rather than render or store again. None when
    no checksum was recorded (the store is not asked) or the key holds nothing or something else. StoreError when
    the store cannot be asked."""
    if not unit.upload_sha256:
        return None
    found = keys.store_for(unit.output).stat(keys.object_key(unit.run_name, unit.key))
    return found if found is not None and found.sha256 == unit.upload_sha256 else None


def adopt_earlier_uploads(settings: Settings, factory: Factory, claim: Claim,
                          meter: Meter) -> tuple[int, list[ClaimedUnit], list[tuple[ClaimedUnit, str]]]:
    """Videos whose earlier attempt uploaded but died before recording it: adopt the object, skip the render.

    Returns how many were adopted, the units to render, and the units to retry without a render: those with an
    earlier checksum recorded whose key the store cannot be asked about now. Their earlier upload may have landed
    (its reply lost to the outage), and a new render can differ from it by a rounding (a batch of another size), so
    its bytes would then meet that object as a conflict and fail the video; the retry asks the store again."""
    adopted, todo, unchecked = 0, [], []
    for unit in claim.units:
        try:
            found = earlier_upload(unit)
        except StoreError as exc:
            log.warning("%s: cannot check its earlier upload, retried without a render: %s", unit.key, exc)
            unchecked.append((unit, error_text(exc)))
            continue
        if found is not None:
            out = VideoOutput(found.uri, found.bytes, found.sha256, 0.0, 0.0, 0.0,
                              poster_uri=adopted_poster(unit, claim.batch.shape.model))
            recorded = record.record_success(factory, unit, out, meter.rate, settings.prices.storage,
                                             meter.session_id)
            adopted += recorded
            if recorded and unit.chunked:
                drop_checkpoints(factory, keys.store_for(unit.output), unit)
        else:
            todo.append(unit)
    return adopted, todo, unchecked
