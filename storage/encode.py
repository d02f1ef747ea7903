"""Frames to MP4 bytes, and MP4 bytes back to facts and frames.

`encode_mp4` is the only writer; `probe_mp4` and `decode_frames` read an output back by decoding it, so tests and
reports check what a player would see rather than what we meant to write.
"""

from __future__ import annotations

import io
import os
import struct
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np

from storage.codecs import CODECS, CRF_MAX, CRF_MIN, PRESETS, encoder_params, unsafe_size

_CRF_RANGE = range(CRF_MIN, CRF_MAX + 1)


@dataclass(frozen=True)
class Mp4Info:
    frames: int  # counted by decoding every frame, not read from the header
    fps: float  # the stream's average_rate
    width: int
    height: int
    codec: str  # e.g. "h264"
    pix_fmt: str  # e.g. "yuv420p"
    duration_s: float
    moov_first: bool  # the index ('moov') precedes the media data ('mdat'): playable while still downloading


def check_frames(frames: np.ndarray, fps: int) -> None:
    """Raise ValueError unless `frames` is (F, H, W, 3) uint8 RGB with even H, W and F >= 1, and fps >= 1."""
    if not isinstance(frames, np.ndarray):
        raise ValueError(f"frames must be a numpy array, got {type(frames).__name__}")
    if frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got dtype {frames.dtype}")
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must have shape (F, H, W, 3), got {frames.shape}")
    count, height, width, _ = frames.shape
    if count < 1:
        raise ValueError("frames must hold at least one frame, got F=0")
    # yuv420p stores chroma at half resolution in both directions, so libx264 rejects odd sizes.
    if height % 2 or width % 2:
        raise ValueError(f"frame height and width must be even for yuv420p, got H={height} W={width}")
    if isinstance(fps, bool) or not isinstance(fps, (int, np.integer)) or fps < 1:
        raise ValueError(f"fps must be an integer >= 1, got {fps!r}")


def encode_mp4(frames: np.ndarray, fps: int, *, crf: int = 18, codec: str = "h264", preset: str = "medium") -> bytes:
    """Encode RGB frames as H.264 or H.265 (yuv420p) in an MP4 whose moov atom comes first; return the file's bytes.

    `codec` and `preset` are storage.codecs' names (h264/h265; x264's presets, medium being x264's own default)."""
    check_frames(frames, fps)
    if isinstance(crf, bool) or not isinstance(crf, (int, np.integer)) or crf not in _CRF_RANGE:
        raise ValueError(f"crf must be an integer in 0..51, got {crf!r}")
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    count, height, width, _ = frames.shape
    if (unsafe := unsafe_size(codec, width, height)) is not None:
        raise ValueError(f"{unsafe} (storage.codecs.unsafe_size)")
    options = {"crf": str(int(crf)), "preset": preset, **encoder_params(codec, width, height)}
    fps = int(fps)
    time_base = Fraction(1, fps)

    # +faststart rewrites the file to move moov ahead of mdat once encoding ends, which needs a seekable file that
    # it can reopen; on an in-memory buffer the muxer fails. So encode into a private temp folder and read it back.
    with tempfile.TemporaryDirectory(prefix="reelbatch-encode-") as folder:
        path = os.path.join(folder, "video.mp4")
        with av.open(path, mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
            stream = container.add_stream(CODECS[codec], rate=fps, options=options)
            if codec == "h265":
                # hvc1, not FFmpeg's default hev1: Apple's players play HEVC in MP4 only when tagged hvc1.
                stream.codec_tag = "hvc1"
            stream.width = width
            stream.height = height
            stream.pix_fmt = "yuv420p"
            # Model output is sRGB. Convert with the BT.709 matrix and tag the stream so, because players assume
            # BT.709 for untagged HD video while swscale's default matrix is BT.601: untagged, colours shift.
            ctx = stream.codec_context
            ctx.colorspace = av.video.reformatter.Colorspace.ITU709
            ctx.color_primaries = av.video.reformatter.ColorPrimaries.BT709
            ctx.color_trc = av.video.reformatter.ColorTrc.BT709
            ctx.color_range = av.video.reformatter.ColorRange.MPEG
            # One reformatter for the video: it keeps its swscale context between frames, where VideoFrame.reformat
            # builds one per frame (0.3 ms each: most of a small preview's encode). The same conversion, bit for bit.
            reformatter = av.video.reformatter.VideoReformatter()
            for index in range(count):
                frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
                frame = reformatter.reformat(
                    frame,
                    format="yuv420p",
                    dst_colorspace=av.video.reformatter.Colorspace.ITU709,
                    dst_color_range=av.video.reformatter.ColorRange.MPEG,
                )
                # Explicit timestamps: one tick per frame at 1/fps, so the muxer sees a constant rate of exactly fps.
                frame.pts = index
                frame.time_base = time_base
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))  # flush the frames x264 holds back for lookahead and B-frames
        return Path(path).read_bytes()


def probe_mp4(source: bytes | str | Path) -> Mp4Info:
    """Decode every frame of an MP4 and report what a player would see."""
    with _binary(source) as f:
        boxes = [kind for kind, _ in _top_level_boxes(f)]
    moov_first = "moov" in boxes and "mdat" in boxes and boxes.index("moov") < boxes.index("mdat")
    with _open(source) as container:
        if not container.streams.video:
            raise ValueError("no video stream in the MP4")
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        if stream.duration is not None:
            duration_s = float(stream.duration * stream.time_base)
        else:
            duration_s = (container.duration or 0) / av.time_base
        return Mp4Info(
            frames=frames,
            fps=float(stream.average_rate or 0),
            width=stream.codec_context.width,
            height=stream.codec_context.height,
            codec=stream.codec_context.name,
            pix_fmt=stream.codec_context.pix_fmt,
            duration_s=duration_s,
            moov_first=moov_first,
        )


def decode_frames(source: bytes | str | Path) -> np.ndarray:
    """Decode an MP4's first video stream to (F, H, W, 3) uint8 RGB."""
    with _open(source) as container:
        reformatter = av.video.reformatter.VideoReformatter()  # one swscale context for every frame (encode_mp4)
        frames = [reformatter.reformat(frame, format="rgb24").to_ndarray() for frame in container.decode(video=0)]
    if not frames:
        raise ValueError("the MP4 has no decodable video frames")
    return np.stack(frames)


def _open(source: bytes | str | Path) -> av.container.InputContainer:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return av.open(io.BytesIO(bytes(source)), mode="r", format="mp4")
    return av.open(str(source), mode="r")


def _binary(source: bytes | str | Path) -> BinaryIO:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(source))
    return open(source, "rb")


def _top_level_boxes(f: BinaryIO):
    """Yield (type, size) of each top-level box; reads headers only, seeking over bodies (ISO/IEC 14496-12 4.2)."""
    f.seek(0, os.SEEK_END)
    end = f.tell()
    offset = 0
    while offset + 8 <= end:
        f.seek(offset)
        size, kind = struct.unpack(">I4s", f.read(8))
        header = 8
        if size == 1:  # 64-bit "largesize" follows the type
            (size,) = struct.unpack(">Q", f.read(8))
            header = 16
        elif size == 0:  # the box runs to the end of the file
            size = end - offset
        if size < header:
            raise ValueError(f"malformed MP4: box {kind!r} at offset {offset} has size {size}")
        yield kind.decode("latin-1"), size
        offset += size
