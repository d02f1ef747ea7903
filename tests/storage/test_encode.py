"""encode_mp4 writes what a player reads back: checked by decoding the bytes with PyAV, not by trusting the writer."""

import io
import struct

import av
import numpy as np
import pytest

from storage.encode import _top_level_boxes, check_frames, decode_frames, encode_mp4, probe_mp4


def gradient_frames(count: int, height: int, width: int) -> np.ndarray:
    """Smooth frames (compress well, so decoded pixels stay close) that differ from frame to frame."""
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    for i in range(count):
        frames[i, ..., 0] = np.broadcast_to(x, (height, width))
        frames[i, ..., 1] = np.broadcast_to(y, (height, width))
        frames[i, ..., 2] = int(255 * i / max(count - 1, 1))
    return frames


@pytest.mark.parametrize(
    ("count", "height", "width", "fps"),
    [(1, 16, 16, 1), (17, 48, 64, 24), (25, 64, 96, 16), (10, 32, 32, 7)],
)
def test_encoded_stream_has_exact_frames_fps_and_size(count, height, width, fps):
    frames = np.random.default_rng(count).integers(0, 256, (count, height, width, 3), dtype=np.uint8)
    info = probe_mp4(encode_mp4(frames, fps))
    assert info.frames == count
    assert info.fps == fps
    assert (info.width, info.height) == (width, height)
    assert info.codec == "h264"
    assert info.pix_fmt == "yuv420p"
    assert info.moov_first is True
    assert info.duration_s == pytest.approx(count / fps, abs=1e-3)


def test_decoded_frames_match_input_in_order():
    frames = gradient_frames(12, 64, 96)
    decoded = decode_frames(encode_mp4(frames, 12))
    assert decoded.shape == frames.shape and decoded.dtype == np.uint8
    error = np.abs(decoded.astype(np.int16) - frames.astype(np.int16))
    assert error.mean() < 3, f"mean abs error {error.mean():.2f} is too high for crf 18 on a gradient"
    # Every decoded frame is closest to its own input: no dropped, duplicated or reordered frames.
    blue = decoded[..., 2].reshape(len(decoded), -1).mean(axis=1)
    assert np.all(np.diff(blue) > 0)


@pytest.mark.parametrize("rgb", [(255, 0, 0), (0, 255, 0), (0, 0, 255), (128, 128, 128), (200, 50, 120)])
def test_colours_survive_the_yuv_round_trip(rgb):
    # Fails if the RGB->YUV matrix used to encode differs from the colourspace the stream is tagged with.
    frames = np.empty((2, 32, 32, 3), dtype=np.uint8)
    frames[:] = rgb
    decoded = decode_frames(encode_mp4(frames, 8))
    assert np.abs(decoded.reshape(-1, 3).mean(axis=0) - np.array(rgb)).max() < 4


def test_crf_controls_quality():
    frames = np.random.default_rng(0).integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
    assert len(encode_mp4(frames, 8, crf=40)) < len(encode_mp4(frames, 8, crf=10))


def test_probe_reads_a_path_like_bytes(tmp_path):
    data = encode_mp4(gradient_frames(5, 32, 48), 10)
    path = tmp_path / "video.mp4"
    path.write_bytes(data)
    assert probe_mp4(path) == probe_mp4(str(path)) == probe_mp4(data)
    np.testing.assert_array_equal(decode_frames(path), decode_frames(data))


def test_moov_first_is_false_without_faststart():
    # A plain mp4 mux writes mdat first and the index at the end; probe must notice.
    frames = gradient_frames(3, 32, 32)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))
    info = probe_mp4(buffer.getvalue())
    assert info.frames == 3
    assert info.moov_first is False


def test_box_parser_handles_64_bit_and_to_end_sizes():
    ftyp = struct.pack(">I4s", 16, b"ftyp") + b"isom\0\0\0\0"
    moov = struct.pack(">I4sQ", 1, b"moov", 16 + 4) + b"abcd"  # size 1: a 64-bit size follows the type
    mdat = struct.pack(">I4s", 0, b"mdat") + b"x" * 10  # size 0: runs to the end of the file
    boxes = list(_top_level_boxes(io.BytesIO(ftyp + moov + mdat)))
    assert boxes == [("ftyp", 16), ("moov", 20), ("mdat", 18)]
    with pytest.raises(ValueError, match="malformed"):
        list(_top_level_boxes(io.BytesIO(struct.pack(">I4s", 4, b"moov"))))


GOOD = np.zeros((2, 16, 16, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    ("frames", "fps", "message"),
    [
        (GOOD.astype(np.float32), 8, "uint8"),
        (GOOD[0], 8, "shape"),
        (np.zeros((2, 16, 16, 4), dtype=np.uint8), 8, "shape"),
        (np.zeros((2, 15, 16, 3), dtype=np.uint8), 8, "even"),
        (np.zeros((2, 16, 17, 3), dtype=np.uint8), 8, "even"),
        (np.zeros((0, 16, 16, 3), dtype=np.uint8), 8, "at least one"),
        (GOOD, 0, "fps"),
        (GOOD, 12.5, "fps"),
        (GOOD.tolist(), 8, "numpy"),
    ],
)
def test_bad_input_is_refused_loudly(frames, fps, message):
    with pytest.raises(ValueError, match=message):
        encode_mp4(frames, fps)
    with pytest.raises(ValueError, match=message):
        check_frames(frames, fps)


@pytest.mark.parametrize("crf", [-1, 52, 18.0])
def test_bad_crf_is_refused(crf):
    with pytest.raises(ValueError, match="crf"):
        encode_mp4(GOOD, 8, crf=crf)


def test_h265_is_hevc_tagged_hvc1_and_decodes_to_the_same_frames():
    frames = gradient_frames(9, 32, 64)
    data = encode_mp4(frames, 8, codec="h265")
    info = probe_mp4(data)
    assert (info.codec, info.pix_fmt, info.frames, info.moov_first) == ("hevc", "yuv420p", 9, True)
    with av.open(io.BytesIO(data), format="mp4") as container:
        assert container.streams.video[0].codec_tag == "hvc1"  # Apple's players want hvc1, not FFmpeg's hev1
    assert np.abs(decode_frames(data).astype(int) - frames.astype(int)).mean() < 3


def test_the_preset_reaches_x264():
    """x264 writes its settings into the stream (an SEI message): x264's preset table gives medium (its default,
    and reelbatch's) ref=3, subme=7, me=hex, and ultrafast ref=1, subme=0, me=dia, no CABAC."""
    frames = np.random.default_rng(3).integers(0, 256, (6, 64, 64, 3), dtype=np.uint8)
    default, fast = encode_mp4(frames, 8), encode_mp4(frames, 8, preset="ultrafast")
    for setting in (b" ref=3 ", b" me=hex ", b" subme=7 ", b"cabac=1 "):
        assert setting in default
    for setting in (b" ref=1 ", b" me=dia ", b" subme=0 ", b"cabac=0 "):
        assert setting in fast
    assert probe_mp4(fast).frames == 6


@pytest.mark.parametrize("kwargs, message", [({"codec": "av1"}, "codec must be one of h264, h265"),
                                             ({"preset": "fastest"}, "preset must be one of ultrafast")])
def test_an_unknown_codec_or_preset_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        encode_mp4(GOOD, 8, **kwargs)


def test_h265_refuses_the_width_libx265_corrupts_memory_at():
    with pytest.raises(ValueError, match="width 48 cannot be encoded as h265: libx265 corrupts memory"):
        encode_mp4(np.zeros((3, 32, 48, 3), dtype=np.uint8), 8, codec="h265")
