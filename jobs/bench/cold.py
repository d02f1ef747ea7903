"""`reelbatch bench cold`: a new worker's cold start, as a new machine meets it, side by side in one run.

Each side is a fresh `reelbatch run` of one video in a folder of its own (its own database, broker, output and
Inductor cache; the model folders are shared, as a machine's image would hold them), timed from process start to
exit, which is when its video is stored. The sides: compile off; compile on with an empty warm-start store
(it compiles, then stores the shape's bundle: jobs.render.warm_bundles); compile on with that store (a second
machine: it unpacks the bundle, then compiles from it). The two compiled sides' MP4s must be the same bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from jobs.errors import ReelbatchError

# What each side has of its own, whatever this process was given.
OWN = ("REELBATCH_DATABASE", "REELBATCH_BROKER", "REELBATCH_OUTPUT", "TORCHINDUCTOR")
SIDES = ("compile off", "compile on, cold", "compile on, from the bundle")


@dataclass(frozen=True)
class Side:
    name: str
    seconds: float  # process start -> its one video stored (the process exits)
    sha256: str
    bundles: int  # bundles in the warm-start store after this side


@dataclass(frozen=True)
class Cold:
    model: str
    sides: list[Side]

    @property
    def speedup(self) -> float:
        """The cold compiled start over the one from the bundle."""
        return self.sides[1].seconds / self.sides[2].seconds

    @property
    def identical(self) -> bool:
        return self.sides[1].sha256 == self.sides[2].sha256


def manifest(model: str, resolution: str, steps: int) -> str:
    return (f"name: cold\nmodel: {model}\ndefaults: {{steps: {steps}, resolution: {resolution}, duration_s: 1}}\n"
            "videos:\n  - {id: first, prompt: a red circle moving right, seed: 7}\n")


def run_cold(model: str, resolution: str, steps: int, on_side=lambda name: None) -> Cold:
    with tempfile.TemporaryDirectory(prefix="reelbatch-cold-") as tmp:
        warm = Path(tmp) / "warm"
        sides = []
        for n, name in enumerate(SIDES):
            on_side(name)
            cwd = Path(tmp) / f"side-{n}"
            cwd.mkdir()
            (cwd / "cold.yaml").write_text(manifest(model, resolution, steps))
            side_env = {k: v for k, v in os.environ.items() if not k.startswith(OWN)}
            side_env.update(REELBATCH_COMPILE="0" if n == 0 else "1", TORCHINDUCTOR_CACHE_DIR=str(cwd / "inductor"))
            if n > 0:
                side_env["REELBATCH_WARM_URI"] = f"file://{warm}/"
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "jobs", "run", "cold.yaml"], cwd=cwd, env=side_env,
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL)
            seconds = time.perf_counter() - started
            if proc.returncode != 0:
                raise ReelbatchError(f"bench cold: side {name!r}: `reelbatch run` exited {proc.returncode}: "
                                     f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
            (line,) = (cwd / "outputs" / "cold" / "results.jsonl").read_text().splitlines()
            bundles = sum(1 for p in warm.rglob("*.tar")) if warm.exists() else 0
            sides.append(Side(name, seconds, json.loads(line)["sha256"], bundles))
        return Cold(model, sides)
