"""One side of a side-by-side bench: what it rendered (SideModel), and its videos, wall time and seconds per stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.models.registry import ModelInfo


@dataclass(frozen=True)
class SideModel:
    """A registration and the steps and guidance one side renders it at."""

    info: ModelInfo
    steps: int
    guidance: float

    def passes(self) -> int:
        """Transformer passes a step: two with classifier-free guidance (above 1, as WanPipeline decides), else one."""
        return 2 if self.guidance > 1.0 else 1

    def describe(self) -> dict:
        """The registration as the bench's JSON records it."""
        info = self.info
        return {"name": info.name, "path": None if info.path is None else str(info.path),
                "adapters": [{"path": str(a.path), "scale": a.scale} for a in info.adapters],
                "sampler": None if info.sampler is None else info.sampler.key(),
                "decoder": None if info.decoder is None else str(info.decoder), "teacher": info.teacher,
                "steps": self.steps, "guidance": self.guidance}


@dataclass
class Side:
    name: str
    videos: int = 0
    wall_s: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)  # SideModel.describe()

    @property
    def videos_per_hour(self) -> float:
        return 3600.0 * self.videos / self.wall_s if self.wall_s else 0.0

    @property
    def compute_s(self) -> float:
        return self.stages.get("denoise", 0.0) + self.stages.get("decode", 0.0)

    def to_dict(self) -> dict:
        return {"videos": self.videos, "wall_s": self.wall_s, "videos_per_hour": self.videos_per_hour,
                "stages": self.stages, "wall_over_compute": self.wall_s / self.compute_s if self.compute_s else None,
                "model": self.model, "config": self.config}
