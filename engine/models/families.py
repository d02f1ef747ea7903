"""What a registered Wan folder is, read from its own config files: its family, the frame and size rules its VAE and
patching impose, and the family's published defaults.

Every family renders with diffusers' WanPipeline, or with WanImageToVideoPipeline for an image-to-video folder (Wan
2.1 I2V, Wan 2.2 I2V A14B: `image_condition: pipeline`), and model_index.json says which one a folder is:
- `wan2.1`: one transformer (Wan2.1-T2V-1.3B and 14B; `tiny` and `toy` are built so).
- `wan2.2-a14b`: a high-noise `transformer` for the steps at or above `boundary_ratio` x 1000 and a low-noise
  `transformer_2` after them (Wan2.2-T2V-A14B), each guided with its own scale.
- `wan2.2-ti2v`: `expand_timesteps`, a timestep per token (Wan2.2-TI2V-5B), with the Wan 2.2 VAE (16x spatial).
The engine's loop (engine.loop.denoise) handles the switch and the per-token timesteps wherever they occur; the family
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

# The pipeline classes a folder's model_index.json may name: text-to-video, and image-to-video (Wan 2.1 I2V with its
# CLIP image encoder, Wan 2.2 I2V A14B with two experts and none), which renders with `image_condition: pipeline`.
IMAGE_PIPELINE = "WanImageToVideoPipeline"
PIPELINES = ("WanPipeline", IMAGE_PIPELINE)

# WanPipeline.check_inputs refuses sides that are not multiples of 16, whatever the VAE and patching allow.
PIPELINE_MULTIPLE = 16


@dataclass(frozen=True)
class FolderFacts:
    family: str
    temporal_factor: int  # the VAE's scale_factor_temporal: frames are temporal_factor * k + 1
    spatial_multiple: int  # sides must be multiples of this: VAE scale x patch, and of 16
    boundary_ratio: float | None  # two-expert folders: the switch, as a fraction of the 1000 training timesteps
    pipeline: str = "WanPipeline"  # model_index.json's _class_name: one of PIPELINES


def read_folder(path: Path, where: str) -> FolderFacts:
    """The facts of the diffusers folder at `path`; ModelNotFound naming the file and key of anything that would
    fail at load (`where` names the registration, e.g. "models.yaml: model 'wan'")."""
    index_file = path / "model_index.json"
    index = _json(index_file, where)
    pipeline = index.get("_class_name")
    if pipeline not in PIPELINES:
        raise ModelNotFound(f"{where}: {index_file}: _class_name is {pipeline!r}; reelbatch renders folders of "
                            f"{' and '.join(PIPELINES)}")
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
    if pipeline == IMAGE_PIPELINE:
        _check_image_folder(path, index, vae, transformer, temporal, where)
    if boundary is not None:
        family = "wan2.2-a14b"
    elif index.get("expand_timesteps"):
        family = "wan2.2-ti2v"
    else:
        family = "wan2.1"
    return FolderFacts(family, temporal, multiple, None if boundary is None else float(boundary), pipeline)


def check_image_condition(facts: FolderFacts, image_condition: str | None, where: str, folder: Path) -> None:
    """A WanImageToVideoPipeline folder renders only through its own image path (`image_condition: pipeline`), and
    that path only from such a folder: its transformer reads the mask and picture channels beside the latents."""
    index_file = folder / "model_index.json"
    if facts.pipeline == IMAGE_PIPELINE and image_condition != "pipeline":
        raise ModelNotFound(f"{where}: {index_file} names {IMAGE_PIPELINE}, whose transformer reads a picture's "
                            f"mask and latents beside the video's: register it with image_condition: pipeline, "
                            f"got {image_condition!r}")
    if image_condition == "pipeline" and facts.pipeline != IMAGE_PIPELINE:
        raise ModelNotFound(f"{where}: image_condition: pipeline needs a {IMAGE_PIPELINE} folder; {index_file} "
                            f"names {facts.pipeline} (register a text-to-video folder with image_condition: "
                            "first_frame, or none)")


def _check_image_folder(path: Path, index: dict, vae: dict, transformer: dict, temporal: int, where: str) -> None:
    """What WanImageToVideoPipeline needs of its folder to render (its __call__ and prepare_latents, diffusers
    0.3x-0.4x): the transformer takes z_dim latents + `temporal` mask channels + z_dim picture latents, and a
    transformer that attends to an image embedding (Wan 2.1 I2V: image_dim set) needs the CLIP image encoder and
    its processor; Wan 2.2 I2V A14B has neither (image_dim null, both components null)."""
    config_file = path / "transformer" / "config.json"
    if index.get("expand_timesteps"):
        raise ModelNotFound(f"{where}: {path / 'model_index.json'}: expand_timesteps with {IMAGE_PIPELINE} "
                            "(Wan 2.2 TI2V) conditions on a clean first frame: register its WanPipeline folder "
                            "with image_condition: first_frame")
    z_dim = int(vae.get("z_dim") or 16)
    wanted = 2 * z_dim + temporal
    if transformer.get("in_channels") != wanted:
        raise ModelNotFound(f"{where}: {config_file}: in_channels is {transformer.get('in_channels')!r}, but "
                            f"{IMAGE_PIPELINE} feeds it {wanted} ({z_dim} latent + {temporal} mask + {z_dim} picture "
                            "channels)")
    if transformer.get("image_dim") is not None:
        for name in ("image_encoder", "image_processor"):
            entry = index.get(name)
            if not (isinstance(entry, list) and len(entry) == 2 and entry[1] is not None):
                raise ModelNotFound(f"{where}: {path / 'model_index.json'}: {name} is {entry!r}, but {config_file} "
                                    f"has image_dim {transformer['image_dim']}: the picture is encoded with the image "
                                    "encoder and its processor")
        _component(path, index, "image_encoder", where, required=True)
        entry = index["image_processor"]
        if not (path / "image_processor" / "preprocessor_config.json").is_file():
            raise ModelNotFound(f"{where}: {path / 'model_index.json'} names image_processor ({entry[1]}) but "
                                f"{path / 'image_processor' / 'preprocessor_config.json'} is missing")


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
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{where}: {path / 'model_index.json'} names {name} ({entry[1]}) but {folder} holds no "
                            ".safetensors weights")
    # diffusers' variant files (`diffusion_pytorch_model.fp16.safetensors`, `...-00001-of-00002.fp16.safetensors`)
    # load only when from_pretrained is given that variant; a folder of plain names loads whatever dtype its tensors
    # are stored in (fp32, bf16 or fp16), each part cast to the engine's dtype.
    plain = [f for f in files if "." not in f.name.removesuffix(".safetensors")]
    if not plain:
        raise ModelNotFound(f"{where}: {folder} holds only variant weight files ({files[0].name}); reelbatch loads "
                            "plain names: rename them without the variant (e.g. diffusion_pytorch_model.safetensors)")
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
