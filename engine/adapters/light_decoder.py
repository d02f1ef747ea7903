"""A light VAE decoder: a small network trained to mimic a model's own decoder, in the spirit of TAEHV / LightVAE.

It takes what `vae.decode` takes (de-normalised latents, B x C x L x h x w) and returns what it returns (frames in
[-1, 1], B x 3 x F x H x W), so it replaces `vae.decode` in the engine's decode step and nothing else changes; the
model's encoder is kept (a long video's chunk ties are latents, untouched).

Causal in time, as Wan's VAE: latent 0 gives 1 frame, every later latent `temporal_factor` frames. TAEHV's layout
(github.com/madebyollin/taehv): per-frame 2-D convolutions, and memory blocks that see the frame before through
their input (a block at time t reads its own input at t and t - 1, so it runs over all frames at once, with no
recurrent state), a temporal "grow" that turns each latent into `temporal_factor` frames, and the first
`temporal_factor - 1` frames dropped so latent 0 is one frame. Each output frame depends on its latent and the ones
before only, so any length decodes, in one pass, with memory linear in the frames.

Saved as a folder: config.json (`_class_name: LightDecoder` and the fields of DecoderConfig) and
diffusion_pytorch_model.safetensors; loaded with `load` below, no diffusers changes needed.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

CLASS_NAME = "LightDecoder"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"


@dataclass(frozen=True)
class DecoderConfig:
    latent_channels: int
    spatial_factor: int  # a power of 2: one 2x upsampling per factor of 2
    temporal_factor: int
    # Width at the latent grid, then after each upsampling (len = log2(spatial_factor) + 1).
    channels: tuple[int, ...] = field(default=(64, 32, 32))
    # Memory blocks at each of those resolutions.
    blocks: int = 1
    # The VAE's latent statistics (its config's latents_mean and latents_std): the decoder normalises its input with
    # them, so it trains on unit-scale values whatever the VAE's scale.
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None
    # A clip-wide causal context at the latent grid: each latent also reads a summary of latent 0 and of every
    # latent up to it (per channel, the max over the grid, so the object's features rather than the background's).
    # Wan's causal VAE codes latent 0 alone, as an image, and each later latent against the frames before it, so a
    # later latent alone can be ambiguous: in the toy VAE's latents a red and a blue object on black are no further
    # apart at latents 1-4 than a video is from its colour's mean (0.11-0.46 against 0.25-0.37; 0.84-0.91 at
    # latent 0), and a one-latent memory decoded such reds blue (docs/TOY_TRAINING.md, toy-fast's phase 3). The
    # VAE's decoder carries colour forward in its causal caches; this carries it at the cost of two small
    # per-latent layers, and keeps the decoder causal, any length in one pass.
    context: bool = False

    def __post_init__(self):
        ups = math.log2(self.spatial_factor)
        if ups != int(ups) or len(self.channels) != int(ups) + 1:
            raise ValueError(f"spatial_factor {self.spatial_factor} needs log2 + 1 = {ups + 1:g} channel widths, "
                             f"got {list(self.channels)}")


class _MemBlock(nn.Module):
    """A residual block that reads its input at t and at t - 1 (zeros before the first frame)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(2 * channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        # x: (B * frames, C, H, W), frame-major within each video.
        past = x.unflatten(0, (-1, frames))
        past = torch.cat([torch.zeros_like(past[:, :1]), past[:, :-1]], dim=1).flatten(0, 1)
        h = F.relu(self.conv1(torch.cat([x, past], dim=1)))
        return F.relu(x + self.conv2(h))


class LightDecoder(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        c = config.channels
        self.conv_in = nn.Conv2d(config.latent_channels, c[0], 3, padding=1)
        if config.context:
            self.context_in = nn.Conv2d(c[0], c[0], 1)
            self.context_out = nn.Linear(2 * c[0], c[0])
        self.latent_blocks = nn.ModuleList(_MemBlock(c[0]) for _ in range(config.blocks))
        # The temporal grow: each latent frame's features become temporal_factor frames' features.
        self.grow = nn.Conv2d(c[0], c[0] * config.temporal_factor, 1)
        self.ups = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(c[:-1], c[1:]))
        self.up_blocks = nn.ModuleList(nn.ModuleList(_MemBlock(b) for _ in range(config.blocks)) for b in c[1:])
        self.conv_out = nn.Conv2d(c[-1], 3, 3, padding=1)
        # A linear path from each latent cell straight to its pixels in every frame it makes (a 1x1 convolution and
        # a pixel shuffle): colour is close to a linear function of the latents, and this path learns it at once,
        # leaving the convolutions the edges and shapes.
        self.skip = nn.Conv2d(config.latent_channels, 3 * config.temporal_factor * config.spatial_factor ** 2, 1)
        if config.latents_mean is not None:
            view = (1, -1, 1, 1, 1)
            self.register_buffer("mean", torch.tensor(config.latents_mean).view(view), persistent=False)
            self.register_buffer("std", torch.tensor(config.latents_std).view(view), persistent=False)
        else:
            self.mean = self.std = None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(B, C, L, h, w) de-normalised latents -> (B, 3, 1 + t * (L - 1), H, W) frames, unclamped."""
        batch, _, latents, h, w = z.shape
        t, s = self.config.temporal_factor, self.config.spatial_factor
        if self.mean is not None:
            z = (z - self.mean) / self.std
        x = z.permute(0, 2, 1, 3, 4).flatten(0, 1)  # (B * L, C, h, w)
        skip = F.pixel_shuffle(self.skip(x).unflatten(1, (t, -1)).flatten(0, 1), s)  # (B * L * t, 3, H, W)
        x = F.relu(self.conv_in(x))
        if self.config.context:
            x = x + self._context(x, batch, latents)
        for block in self.latent_blocks:
            x = block(x, latents)
        x = self.grow(x).unflatten(1, (t, -1)).flatten(0, 1)  # (B * L * t, C, h, w), frame-major
        frames = latents * t
        for up, blocks in zip(self.ups, self.up_blocks):
            x = F.relu(up(F.interpolate(x, scale_factor=2, mode="nearest")))
            for block in blocks:
                x = block(x, frames)
        x = (self.conv_out(x) + skip).unflatten(0, (batch, frames))[:, t - 1 :]  # latent 0 is one frame
        return x.permute(0, 2, 1, 3, 4)

    def _context(self, x: torch.Tensor, batch: int, latents: int) -> torch.Tensor:
        """(B * L, C, h, w) features -> (B * L, C, 1, 1): from latent 0's summary and the running mean of the
        summaries up to each latent (causal: latent t reads latents 0..t only)."""
        summary = F.relu(self.context_in(x)).amax(dim=(2, 3)).unflatten(0, (batch, latents))  # (B, L, C)
        count = torch.arange(1, latents + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
        both = torch.cat([summary[:, :1].expand_as(summary), summary.cumsum(dim=1) / count], dim=2)
        return self.context_out(both).flatten(0, 1)[:, :, None, None]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """As `AutoencoderKLWan.decode(z, return_dict=False)[0]`: frames clamped to [-1, 1]."""
        return self.forward(z.to(self.conv_in.weight.dtype)).clamp(-1.0, 1.0)


def save(decoder: LightDecoder, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"_class_name": CLASS_NAME, **asdict(decoder.config)}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file({k: v.contiguous() for k, v in decoder.state_dict().items()}, folder / WEIGHTS_FILE)


def read_config(folder: Path) -> DecoderConfig:
    """The folder's config; ValueError says what is wrong with it."""
    data = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    if data.get("_class_name") != CLASS_NAME:
        raise ValueError(f"_class_name is {data.get('_class_name')!r}, expected {CLASS_NAME!r}")
    fields = {k: v for k, v in data.items() if k != "_class_name"}
    unknown = set(fields) - set(DecoderConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    tuples = {k: tuple(fields[k]) for k in ("channels", "latents_mean", "latents_std") if fields.get(k) is not None}
    return DecoderConfig(**{**fields, **tuples})


def load(folder: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> LightDecoder:
    from safetensors.torch import load_file

    decoder = LightDecoder(read_config(folder))
    decoder.load_state_dict(load_file(folder / WEIGHTS_FILE))
    return decoder.to(device, dtype).eval().requires_grad_(False)
