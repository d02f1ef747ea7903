"""The encoders a run may choose, by the names manifests use, and the settings they share.

Two codecs: H.264 (libx264, the default, which every player decodes) and H.265 (libx265, about half the bytes at the
same quality but not every browser decodes it). Both take x264's preset names and a CRF of 0-51. Kept apart from
storage.encode so that a manifest can be checked without loading PyAV: only a codec other than the default asks it.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def unsafe_width(codec: str, width: int) -> bool:
    return width in UNSAFE_WIDTHS.get(codec, ())


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
