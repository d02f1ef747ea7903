"""A stored video's poster (storage.poster: its middle frame as a JPEG), put beside its MP4 with the same write-once
store semantics.

The poster is a function of the MP4's bytes, so a retry that adopts an MP4 an earlier attempt uploaded puts the same
poster bytes (a no-op) rather than a conflicting object. A poster never fails a video: a different object already at
its key (left there by hand, or by a worker whose Pillow encodes JPEG differently) leaves the video without one
(`poster_uri` null; reports then decode its MP4 instead). Where the store cannot be reached, the first attempt
retries the video as for its MP4 (the retry adopts the MP4 and puts the poster again); an adopted video whose poster
cannot be stored is recorded without one.
"""

from __future__ import annotations

import hashlib
import logging

from jobs.claims.claims import ClaimedUnit
from jobs.manifest import keys
from storage.poster import CONTENT_TYPE, poster_jpeg
from storage.stores import ObjectConflict

log = logging.getLogger(__name__)


def put_poster(unit: ClaimedUnit, data: bytes, model: str) -> str | None:
    """Store the poster (`poster_jpeg` of the video's MP4); its URI, or None if another object holds its key. Other
    store errors propagate."""
    key = keys.poster_key(unit.run_name, unit.key)
    try:
        stored = keys.store_for(unit.output).put(
            key, data, sha256=hashlib.sha256(data).hexdigest(), content_type=CONTENT_TYPE,
            metadata={"run": unit.run_name, "id": unit.key, "seed": str(unit.seed), "model": model})
    except ObjectConflict as exc:
        log.warning("%s: no poster: %s", unit.key, exc)
        return None
    return stored.uri


def adopted_poster(unit: ClaimedUnit, model: str) -> str | None:
    """The poster of an adopted MP4 (its earlier attempt may have died before putting it); None if it cannot be."""
    try:
        mp4 = keys.store_for(unit.output).get(keys.object_key(unit.run_name, unit.key))
        return put_poster(unit, poster_jpeg(mp4), model)
    except Exception as exc:  # noqa: BLE001 - a preview must not fail a video that is stored
        log.warning("%s: adopted without a poster: %s", unit.key, exc)
        return None
