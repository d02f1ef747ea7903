"""The encoders a run may choose, by the names manifests use, and the settings they share.

Two codecs: H.264 (libx264, the default, which every player decodes) and H.265 (libx265, about half the bytes at the
same quality but not every browser decodes it). Both take x264's preset names and a CRF of 0-51. Kept apart from
storage.encode so that a manifest can be checked without loading PyAV: only a codec other than the default asks it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

# Manifest name -> FFmpeg encoder.
CODECS = {"h264": "libx264", "h265": "libx265"}
# x264 --fullhelp "--preset": the same ten names in x265 (x265 --help), fastest to slowest.
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")
# x264 --fullhelp: "--crf <float> Quality-based VBR (-12-51)"; for 8-bit input 0 is lossless luma. x265 the same 0-51.
CRF_MIN, CRF_MAX = 0, 51
# libx265 as PyAV 18.1 builds it corrupts the heap (glibc aborts: "corrupted size vs. prev_size") encoding frames
# 48 pixels wide, at every preset; every other multiple of 16 from 16 to 2048 encodes cleanly (measured under
# MALLOC_CHECK_=3, 2026-12). Such videos are refused at submit, and encode_mp4 refuses them too, so no worker's
# memory is put at risk.
UNSAFE_WIDTHS = {"h265": frozenset({48})}
# x265 CTU sizes, largest first. A picture whose smaller side is no larger than its CTU encodes to other bytes from
# run to run (libx265 reads memory it never wrote: tests/storage/test_reproducible.py). A 16-pixel side leaves no
# smaller CTU.
_CTUS = (64, 32, 16)
# x264's AVX-512 kernels read memory they never wrote, so the same frames encode to other bytes from one process
# state to the next (measured 2026-12 on an AMD EPYC with AVX-512, libx264 core 165: 1 to 6 different MP4s in 6
# runs at sizes from 32x32 to 480p; with x264 held to AVX2, 1 in 6 at every size, and no slower). x264 turns them on
# when the CPU has all five of these (its common/cpu.c) and the OS saves their registers (the kernel lists the flags
# only then).
X264_AVX512 = frozenset({"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"})


def unsafe_size(codec: str, width: int, height: int) -> str | None:
    """Why `codec` cannot encode frames of this size safely and reproducibly, or None if it can."""
    if width in UNSAFE_WIDTHS.get(codec, ()):
        return f"width {width} cannot be encoded as {codec}: libx265 corrupts memory at that width"
    if codec == "h265" and min(width, height) <= _CTUS[-1]:
        side = "width" if width <= height else "height"
        return (f"{side} {min(width, height)} cannot be encoded as {codec}: libx265 encodes a side that small to "
                "different bytes from run to run")
    return None


def encoder_params(codec: str, width: int, height: int, flags: frozenset[str] | None = None) -> dict[str, str]:
    """The encoder's own options that make its bytes a function of the frames alone, so that a video encoded again
    (a retry whose upload's reply was lost) matches the object already stored. `flags`: the CPU's (default: this
    machine's, from /proc/cpuinfo)."""
    if codec == "h265":
        # log-level: x265 prints its settings to stderr at info level otherwise.
        ctu = next(c for c in _CTUS if c < min(width, height))
        return {"x265-params": f"log-level=error:ctu={ctu}"}
    if X264_AVX512 <= (cpu_flags() if flags is None else flags):
        # x264's cumulative name: every instruction set up to AVX2 (x264's cpu.c), all of which an AVX-512 CPU has.
        return {"x264-params": "asm=avx2"}
    return {}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags as Linux lists them; none elsewhere (x264 is then left to its own choice)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return frozenset()
    return next((frozenset(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), frozenset())


@dataclass(frozen=True)
class Encoding:
    """How a run's videos are encoded. The defaults are what reelbatch always used: H.264 at CRF 18, x264's own
    default preset (medium), so a run that names none encodes the same bytes as before."""

    codec: str = "h264"
    crf: int = 18
    preset: str = "medium"

    @property
    def encoder(self) -> str:
        return CODECS[self.codec]


DEFAULT = Encoding()


def missing_encoder(codec: str) -> str | None:
    """The FFmpeg encoder `codec` needs if this process's PyAV build lacks it, else None."""
    import av  # here, not at the top: checking a manifest loads PyAV only when it names a codec

    encoder = CODECS[codec]
    try:
        av.codec.Codec(encoder, "w")  # an encoder, not just a decoder of the same name
    except ValueError:  # av.codec.codec.UnknownCodecError
        return encoder
    return None
