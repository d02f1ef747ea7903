"""A video's poster: one frame of its MP4 as a JPEG, for reports and galleries that should not decode every video.

The poster is the middle frame (index frames // 2: frame 4 of 9, 40 of 81), decoded from the stored MP4 rather than
taken from the rendered frames, so it shows what a player shows and is a function of the MP4's bytes alone: a worker
that adopts an MP4 an earlier attempt uploaded makes the same poster that attempt made, and the write-once store
sees the same bytes (a no-op) instead of a conflict.
"""

from __future__ import annotations

import io
from itertools import islice

# Pillow's JPEG quality (0-95 useful): 90 keeps a preview free of visible blocking at a few KB for small clips.
QUALITY = 90
CONTENT_TYPE = "image/jpeg"
SUFFIX = ".jpg"


def middle_frame(count: int) -> int:
    """The index of the poster frame among `count` frames."""
    return count // 2


def poster_jpeg(mp4: bytes) -> bytes:
    """The JPEG of the MP4's middle frame. Raises ValueError if the MP4 has no decodable frame."""
    # PyAV and Pillow here, not at the top: every command imports this module (for SUFFIX, through jobs.manifest.keys
    # and the manifest loader), and PyAV took 0.08 s of each command's start-up (docs/PERFORMANCE.md).
    import av
    from PIL import Image

    with av.open(io.BytesIO(mp4), mode="r", format="mp4") as container:
        stream = container.streams.video[0]
        # One decoding thread: FFmpeg's default frame threads start up and hand frames along for every poster, which
        # made a 9-frame 32x32 preview's poster 3.0 ms of wall instead of 1.0 (CPU 1.0 -> 0.7 ms); the same frame.
        # A worker's store threads (jobs.render.store) are what decode several posters at once.
        stream.codec_context.thread_count = 1
        if stream.frames:  # MP4's sample table holds the exact count: decode only up to the middle frame
            frame = next(islice(container.decode(stream), middle_frame(stream.frames), None), None)
        else:
            decoded = list(container.decode(stream))
            frame = decoded[middle_frame(len(decoded))] if decoded else None
        if frame is None:
            raise ValueError("the MP4 has no decodable video frames")
        rgb = frame.to_ndarray(format="rgb24")
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=QUALITY)
    return buffer.getvalue()
