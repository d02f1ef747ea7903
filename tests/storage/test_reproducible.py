"""The same frames encode to the same bytes, whatever the process did before: a retry that encodes a video again
must match the MP4 already stored (jobs/render/batch.py adopts it by checksum), and a contact sheet must show what
the worker stored.

Both encoders, as PyAV 18.1 builds them, read memory they never wrote (x264's AVX-512 kernels; x265 on a picture no
larger than its CTU), so their bytes followed whatever the heap held. glibc's MALLOC_PERTURB_ fills freed and newly
allocated memory with a chosen byte: encoding under several such bytes shows whether anything the encoder never
wrote reaches the MP4.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from storage.codecs import encoder_params, unsafe_size
from storage.encode import encode_mp4

REPO = Path(__file__).resolve().parents[2]
X264_AVX512 = frozenset({"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"})

# Encodes a square sliding over a noisy gray background at each size and prints one SHA-256 per MP4.
ENCODE = """
import hashlib, sys
import numpy as np
from storage.encode import encode_mp4

def scene(count, height, width):
    rng = np.random.default_rng(0)
    frames = np.full((count, height, width, 3), 96, dtype=np.int16)
    side = width // 4
    for t in range(count):
        x = (t * width // count) % (width - side)
        frames[t, height // 3 : height // 3 + side, x : x + side] = (200, 40, 40)
    return np.clip(frames + rng.integers(-6, 7, frames.shape), 0, 255).astype(np.uint8)

for case in sys.argv[1:]:
    codec, size = case.split(":")
    width, height = map(int, size.split("x"))
    print(hashlib.sha256(encode_mp4(scene(9, height, width), 8, codec=codec)).hexdigest())
"""
# Before the fix, on this project's AMD EPYC (AVX-512): h264 32x32 and 64x64 and h265 32x32 and 64x64 each gave 4
# or 5 different MP4s under these 5 perturb bytes.
CASES = ("h264:32x32", "h264:64x64", "h264:272x480", "h265:32x32", "h265:64x64", "h265:64x32")


def test_the_same_frames_encode_to_the_same_bytes_whatever_the_heap_held():
    runs = []
    for perturb in ("0", "1", "7", "99", "200"):
        proc = subprocess.run([sys.executable, "-c", ENCODE, *CASES], cwd=REPO, capture_output=True, text=True,
                              env={"PYTHONPATH": str(REPO), "MALLOC_PERTURB_": perturb}, timeout=120)
        assert proc.returncode == 0, proc.stderr
        runs.append(proc.stdout.split())
    for case, digests in zip(CASES, zip(*runs)):
        assert len(set(digests)) == 1, f"{case}: {len(set(digests))} different MP4s from 5 heaps"


def test_x264_is_held_to_avx2_only_where_it_would_use_avx512():
    assert encoder_params("h264", 832, 480, X264_AVX512 | {"avx2", "sse4_2"}) == {"x264-params": "asm=avx2"}
    # x264 takes AVX-512 only with all five (its common/cpu.c): without avx512vl it stays on AVX2 by itself.
    assert encoder_params("h264", 832, 480, X264_AVX512 - {"avx512vl"}) == {}
    assert encoder_params("h264", 832, 480, frozenset({"avx2", "fma", "bmi2"})) == {}


@pytest.mark.parametrize(("width", "height", "ctu"), [(32, 32, 16), (64, 32, 16), (64, 64, 32), (96, 64, 32),
                                                      (80, 80, 64), (832, 480, 64), (1280, 720, 64)])
def test_x265_takes_the_largest_ctu_smaller_than_the_pictures_shorter_side(width, height, ctu):
    assert encoder_params("h265", width, height, frozenset()) == {"x265-params": f"log-level=error:ctu={ctu}"}


def test_h265_refuses_a_side_of_16_and_a_width_of_48():
    assert unsafe_size("h265", 64, 16) == ("height 16 cannot be encoded as h265: libx265 encodes a side that small "
                                           "to different bytes from run to run")
    assert unsafe_size("h265", 16, 64).startswith("width 16 cannot be encoded as h265")
    assert unsafe_size("h265", 48, 32) == "width 48 cannot be encoded as h265: libx265 corrupts memory at that width"
    assert unsafe_size("h265", 32, 48) is None and unsafe_size("h264", 16, 16) is None
    with pytest.raises(ValueError, match=r"height 16 cannot be encoded as h265.*\(storage.codecs.unsafe_size\)"):
        encode_mp4(np.zeros((3, 16, 32, 3), dtype=np.uint8), 8, codec="h265")
