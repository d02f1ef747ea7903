"""What a registered Wan folder is, read from its own config files: its family, the frame and size rules its VAE and
patching impose, and the family's published defaults.

Every family renders with diffusers' WanPipeline, and model_index.json says which one a folder is:
- `wan2.1`: one transformer (Wan2.1-T2V-1.3B and 14B; `tiny` and `toy` are built so).
- `wan2.2-a14b`: a high-noise `transformer` for the steps at or above `boundary_ratio` x 1000 and a low-noise
  `transformer_2` after them (Wan2.2-T2V-A14B), each guided with its own scale.
- `wan2.2-ti2v`: `expand_timesteps`, a timestep per token (Wan2.2-TI2V-5B), with the Wan 2.2 VAE (16x spatial).
The engine's loop (engine.denoise) handles the switch and the per-token timesteps wherever they occur; the family
only picks the defaults a models file inherits.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelNotFound

FAMILIES = ("wan2.1", "wan2.2-a14b", "wan2.2-ti2v")


@dataclass(frozen=True)
class Published:
    """A family's published defaults: the shape and sampling its model card and reference code use."""

    width: int
    height: int
    fps: int
    duration_s: float
    steps: int
    guidance: float
    max_frames: int  # the window the model was trained on
    guidance_2: float | None = None  # the low-noise expert's scale (two-expert families only)


PUBLISHED = {
    # Wan2.1-T2V-1.3B: 832x480, 81 frames at 16 fps, 50 steps, guidance 5.0 (its model card and diffusers' example).
    "wan2.1": Published(832, 480, 16, 5.0, 50, 5.0, max_frames=81),
    # Wan2.2-T2V-A14B (Wan2.2's wan/configs/wan_t2v_A14B.py and shared_config.py): 40 steps, sample_guide_scale
    # (3.0, 4.0) for (low noise, high noise), frame_num 81 at sample_fps 16; sizes 1280x720 and 832x480
    # (SUPPORTED_SIZES in wan/configs/__init__.py). The manifest's guidance is the high-noise expert's.
    "wan2.2-a14b": Published(1280, 720, 16, 5.0, 40, 4.0, max_frames=81, guidance_2=3.0),
    # Wan2.2-TI2V-5B (wan/configs/wan_ti2v_5B.py): 1280x704 (its only sizes: 1280x704 and 704x1280), 121 frames at
    # sample_fps 24 (5 s), 50 steps, guidance 5.0.
    "wan2.2-ti2v": Published(1280, 704, 24, 5.0, 50, 5.0, max_frames=121),
}

# WanPipeline.check_inputs refuses sides that are not multiples of 16, whatever the VAE and patching allow.
PIPELINE_MULTIPLE = 16


@dataclass(frozen=True)
class FolderFacts:
    family: str
    temporal_factor: int  # the VAE's scale_factor_temporal: frames are temporal_factor * k + 1
    spatial_multiple: int  # sides must be multiples of this: VAE scale x patch, and of 16
    boundary_ratio: float | None  # two-expert folders: the switch, as a fraction of the 1000 training timesteps


def read_folder(path: Path, where: str) -> FolderFacts:
    """The facts of the diffusers folder at `path`; ModelNotFound naming the file and key of anything that would
    fail at load (`where` names the registration, e.g. "models.yaml: model 'wan'")."""
    index_file = path / "model_index.json"
    index = _json(index_file, where)
    if index.get("_class_name") != "WanPipeline":
        raise ModelNotFound(f"{where}: {index_file}: _class_name is {index.get('_class_name')!r}; reelbatch "
                            "renders text-to-video folders of WanPipeline")
    two_experts = _component(path, index, "transformer_2", where)
    _component(path, index, "transformer", where, required=True)
    _component(path, index, "vae", where, required=True)
    boundary = index.get("boundary_ratio")
    if boundary is not None:
        if not isinstance(boundary, (int, float)) or not 0 < boundary < 1:
            raise ModelNotFound(f"{where}: {index_file}: boundary_ratio must be a number between 0 and 1, got "
                                f"{boundary!r}")
        if not two_experts:
            raise ModelNotFound(f"{where}: {index_file}: boundary_ratio {boundary} switches to transformer_2, "
                                "which is null")
    vae = _json(path / "vae" / "config.json", where)
    transformer = _json(path / "transformer" / "config.json", where)
    # AutoencoderKLWan's own defaults (4 and 8) where an older config leaves the keys out, as WanPipeline does.
    temporal = int(vae.get("scale_factor_temporal") or 4)
    spatial = int(vae.get("scale_factor_spatial") or 8)
    _, patch_h, patch_w = transformer.get("patch_size", (1, 2, 2))
    multiple = math.lcm(PIPELINE_MULTIPLE, spatial * patch_h, spatial * patch_w)
    if boundary is not None:
        family = "wan2.2-a14b"
    elif index.get("expand_timesteps"):
        family = "wan2.2-ti2v"
    else:
        family = "wan2.1"
    return FolderFacts(family, temporal, multiple, None if boundary is None else float(boundary))


def _component(path: Path, index: dict, name: str, where: str, required: bool = False) -> bool:
    """Whether model_index.json names component `name`; one it names must have its config and safetensors."""
    entry = index.get(name)
    named = isinstance(entry, list) and len(entry) == 2 and entry[1] is not None
    if not named:
        if required:
            raise ModelNotFound(f"{where}: {path / 'model_index.json'}: {name} is {entry!r}; a Wan folder needs one")
        return False
    folder = path / name
    if not (folder / "config.json").is_file():
        raise ModelNotFound(f"{where}: {path / 'model_index.json'} names {name} ({entry[1]}) but "
                            f"{folder / 'config.json'} is missing")
    if not any(folder.glob("*.safetensors")):
        raise ModelNotFound(f"{where}: {path / 'model_index.json'} names {name} ({entry[1]}) but {folder} holds no "
                            ".safetensors weights")
    return True


def _json(file: Path, where: str) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelNotFound(f"{where}: {file} is missing") from None
    except json.JSONDecodeError as exc:
        raise ModelNotFound(f"{where}: {file}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelNotFound(f"{where}: {file}: expected a JSON object")
    return data
