"""One side of a side-by-side bench: videos, wall time and seconds per stage."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Side:
    name: str
    videos: int = 0
    wall_s: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    @property
    def videos_per_hour(self) -> float:
        return 3600.0 * self.videos / self.wall_s if self.wall_s else 0.0

    @property
    def compute_s(self) -> float:
        return self.stages.get("denoise", 0.0) + self.stages.get("decode", 0.0)

    def to_dict(self) -> dict:
        return {"videos": self.videos, "wall_s": self.wall_s, "videos_per_hour": self.videos_per_hour,
                "stages": self.stages, "wall_over_compute": self.wall_s / self.compute_s if self.compute_s else None,
                "config": self.config}
