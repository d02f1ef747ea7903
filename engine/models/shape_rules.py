"""The shapes a Wan folder can render, read from its own config files: sides on the grid of the VAE's spatial factor
times the transformer's patch (and WanPipeline's 16), and no axis longer than the transformer's rotary embedding has
positions for.

diffusers' WanRotaryPosEmbed (transformer_wan.py) builds `rope_max_seq_len` positions per axis when the transformer
is made and slices them at each call, `freqs[:ppw].view(1, 1, ppw, -1)`, where ppw is the width in patches (the
width / the VAE's spatial factor / the patch). A video more patches wide, high or long than that slices fewer rows
than it views, and fails before its first step. The toy folder (64 positions, 10 rotary channels for the width)
asked for Wan 2.1's 832 px (832 / 4 / 2 = 104 patches) fails so: `shape '[1, 1, 104, -1]' is invalid for input of
size 640` (64 x 10). Refused before anything is written instead: a manifest's size at submit (jobs.manifest.fields),
a registration's defaults and window when the models file is read (engine.models.file).

JSON only: the registry is read at submit, which imports neither torch nor diffusers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelNotFound
from engine.models.families import PIPELINE_MULTIPLE


@dataclass(frozen=True)
class ShapeRules:
    """What a folder's vae/config.json and transformer/config.json allow."""

    vae_spatial: int  # scale_factor_spatial (AutoencoderKLWan's 8 when a config leaves it out)
    vae_temporal: int  # scale_factor_temporal (4)
    patch: tuple[int, int, int]  # patch_size: (time, height, width)
    rope_max_seq_len: int  # positions per axis, in patches (WanTransformer3DModel's 1024 when left out)

    @property
    def multiple(self) -> int:
        """The grid sides must be on: the VAE's factor times each side's patch, and WanPipeline's 16."""
        return math.lcm(PIPELINE_MULTIPLE, self.vae_spatial * self.patch[1], self.vae_spatial * self.patch[2])

    def side_problem(self, model: str, side: str, n: int, multiple: int) -> str | None:
        """Why `side` ("width" or "height") of `n` pixels cannot render on `model`, as the words after the value
        ("is not a multiple of 16 (...)"), or None. `multiple`: the registration's grid (its spatial_multiple, a
        multiple of this folder's)."""
        patch = self.patch[2] if side == "width" else self.patch[1]
        cell = self.vae_spatial * patch
        if n % multiple:
            why = f"VAE factor {self.vae_spatial} x patch {patch}"
            if multiple != cell:
                why += (f", and WanPipeline's {PIPELINE_MULTIPLE}" if multiple == self.multiple
                        else f"; its registration's spatial_multiple {multiple}")
            return f"is not a multiple of {multiple} ({model}: {why})"
        if n // cell > self.rope_max_seq_len:
            most = self.rope_max_seq_len * cell // multiple * multiple
            return (f"is {n // cell} patches, over the {self.rope_max_seq_len} positions of its rotary embedding "
                    f"({model}: transformer/config.json rope_max_seq_len {self.rope_max_seq_len}, VAE factor "
                    f"{self.vae_spatial} x patch {patch}): at most {most}")
        return None

    def window_problem(self, model: str, frames: int) -> str | None:
        """Why a pass of `frames` frames (one window) cannot render on `model`, as the words after the value, or
        None."""
        latents = (frames - 1) // self.vae_temporal + 1
        if latents // self.patch[0] > self.rope_max_seq_len:
            most = (self.rope_max_seq_len * self.patch[0] - 1) * self.vae_temporal + 1
            return (f"frames are {latents} latent frames a pass, over the {self.rope_max_seq_len} positions of its "
                    f"rotary embedding ({model}: transformer/config.json rope_max_seq_len {self.rope_max_seq_len}, "
                    f"VAE factor {self.vae_temporal} in time): at most {most}")
        return None


# The tiny builds' shape (engine.models.tiny makes its transformers from these, so the rule and the folder agree):
# AutoencoderKLWan's default factors (8 in space, 4 in time) and 2x2 patches with 256 rotary positions.
TINY_RULES = ShapeRules(vae_spatial=8, vae_temporal=4, patch=(1, 2, 2), rope_max_seq_len=256)


def read_rules(path: Path, base: Path | None = None, where: str = "") -> ShapeRules:
    """The rules of the folder at `path`; each component's config read from `path`, else from `base` (a fine-tune
    that ships only its transformer)."""
    vae = _config(path, base, "vae", where)
    transformer = _config(path, base, "transformer", where)
    patch = transformer.get("patch_size") or (1, 2, 2)
    # The library's own defaults where a config leaves a key out (AutoencoderKLWan, WanTransformer3DModel).
    return ShapeRules(vae_spatial=int(vae.get("scale_factor_spatial") or 8),
                      vae_temporal=int(vae.get("scale_factor_temporal") or 4),
                      patch=(int(patch[0]), int(patch[1]), int(patch[2])),
                      rope_max_seq_len=int(transformer.get("rope_max_seq_len") or 1024))


def rules_of(info) -> ShapeRules:
    """A registration's rules (engine.models.registry.ModelInfo `info`): those read when it was registered, else its
    folder's."""
    return info.rules if info.rules is not None else read_rules(info.path, info.base, f"model {info.name}")


def heads_of(path: Path | None, base: Path | None = None) -> int | None:
    """The attention heads of the transformer of the folder at `path` (else `base`, a fine-tune's: its
    transformer/config.json, or transformer_2's); None where there is no such folder (a built-in model not made
    yet)."""
    for part in ("transformer", "transformer_2"):
        for root in (path, base):
            file = None if root is None else Path(root) / part / "config.json"
            if file is not None and file.is_file():
                try:
                    heads = json.loads(file.read_text(encoding="utf-8")).get("num_attention_heads", 40)
                except (OSError, json.JSONDecodeError, AttributeError):
                    return None
                return heads if isinstance(heads, int) else None
    return None


def _config(path: Path, base: Path | None, part: str, where: str) -> dict:
    file = path / part / "config.json"
    if not file.is_file() and base is not None:
        file = base / part / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelNotFound(f"{where}: {file}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelNotFound(f"{where}: {file}: expected a JSON object")
    return data


def check_registration(info, line: str, given: dict, family: str) -> None:
    """A registration whose own shape cannot render is refused when the models file is read: its default sides
    (`given`: the entry's `defaults`; the others are `family`'s published ones) and its window (`max_frames`).
    `info` is the engine.models.registry.ModelInfo being registered, `line` the models file's FILE:LINE of its entry."""
    rules = info.rules
    for side in ("width", "height"):
        n = getattr(info.defaults, side)
        problem = rules.side_problem(info.name, side, n, info.spatial_multiple)
        if problem is not None:
            source = "" if side in given else f" ({family}'s published default: the entry gives no defaults.{side})"
            raise ModelNotFound(f"{line}: model {info.name!r}: defaults.{side}: {n}{source} {problem}; give it "
                                "defaults: {width: W, height: H} that fit")
    problem = rules.window_problem(info.name, info.max_frames)
    if problem is not None:
        raise ModelNotFound(f"{line}: model {info.name!r}: max_frames: {info.max_frames} {problem}")
