"""Measure the profiles reelbatch ships for its built-in models (jobs/cost/shipped_profiles.json), so that
`reelbatch estimate` has a basis on a fresh database.

For each built-in model: a run of VIDEOS videos at the registration's own defaults (no size, steps or guidance in the
manifest; toy-world prompts, and the example pictures for the image-to-video models), rendered by `reelbatch run` on
the embedded default in a fresh folder, REPEATS times. The seconds per video are the ledger's, read the way
`estimate` reads a measured shape (jobs.cost.estimate.Estimator), so the shipped figure is the one the user's own
ledger would give on the same machine. Writes the file and prints one line per model and run.

    python scripts/measure_profiles.py [--videos 8] [--repeats 2] [--out jobs/cost/shipped_profiles.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.models.registry import builtin_models  # noqa: E402
from jobs.cost.estimate import Estimator, VideoShape  # noqa: E402
from jobs.cost.profiles import Profile, as_entry, load  # noqa: E402
from jobs.db.connect import session_factory  # noqa: E402
from jobs.settings import Settings  # noqa: E402

PROMPTS = [f"a {c} {s} moving {d} on a {b} background" for c, s, d, b in [
    ("red", "circle", "left", "black"), ("blue", "square", "up", "gray"), ("yellow", "circle", "right", "black"),
    ("green", "square", "down", "gray"), ("white", "circle", "up", "black"), ("red", "square", "down", "gray"),
    ("blue", "circle", "right", "gray"), ("yellow", "square", "left", "black")]]
PICTURES = sorted((ROOT / "manifests" / "examples" / "pictures").glob("*.png"))


def manifest(name: str, model: str, videos: int, images: bool) -> str:
    lines = [f"name: {name}", f"model: {model}", "videos:"]
    for i in range(videos):
        lines += [f"  - id: v{i}", f"    prompt: {PROMPTS[i % len(PROMPTS)]}", f"    seed: {i}"]
        if images:
            lines.append(f"    image: pictures/{PICTURES[i % len(PICTURES)].name}")  # copied beside the manifest
    return "\n".join(lines) + "\n"


def measure(model: str, videos: int, images: bool, run: int) -> tuple[float, VideoShape]:
    info = builtin_models()[model]
    d = info.defaults
    frames = info.valid_frames(math.floor(d.duration_s * d.fps + 0.5))  # as jobs.manifest.fields does
    shape = VideoShape(model=model, width=d.width, height=d.height, frames=frames, steps=d.steps,
                       guidance=d.guidance)
    with tempfile.TemporaryDirectory(prefix="reelbatch-profile-") as tmp:
        path = Path(tmp) / "run.yaml"
        shutil.copytree(PICTURES[0].parent, Path(tmp) / "pictures")
        path.write_text(manifest(f"profile-{run}", model, videos, images), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for name in [k for k in env if k.startswith("REELBATCH_")]:
            del env[name]
        subprocess.run([sys.executable, "-m", "jobs", "run", str(path)], cwd=tmp, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        factory = session_factory(f"sqlite:///{tmp}/reelbatch.db")
        with factory() as s:
            basis = Estimator(s, {}).seconds(shape)
        if basis.kind.value != "measured" or basis.detail["videos"] != videos:
            raise SystemExit(f"{model}: expected {videos} measured videos of {shape}, got {basis}")
        return basis.seconds, shape


def bench(model: str, videos: int) -> Profile:
    """A distilled registration renders for users only once its gate has passed on their machine, so it is timed by
    `reelbatch bench --model NAME --speed-only` instead, which records the worker path's seconds per video (its wall
    time over its videos) at the preset's shape: `small` is the toy world's 32x32, 9 frames, and the side renders
    the registration's own steps and guidance."""
    with tempfile.TemporaryDirectory(prefix="reelbatch-profile-") as tmp:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")}, "PYTHONPATH": str(ROOT),
               "REELBATCH_CACHE_DIR": tmp}
        subprocess.run([sys.executable, "-m", "jobs", "bench", "--preset", "small", "--model", model, "--speed-only",
                        "--videos", str(videos)], cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
        return load(Path(tmp))[model]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "jobs" / "cost" / "shipped_profiles.json")
    args = ap.parse_args()
    device = f"cpu ({os.cpu_count()} cores, {platform.machine()})"
    load_ = f"load average {os.getloadavg()[0]:.1f} at the start"
    profiles = {}
    for model, info in sorted(builtin_models().items()):
        if info.teacher is not None:
            timed = [bench(model, args.videos) for _ in range(args.repeats)]
            runs = [p.seconds_per_video for p in timed]
            print(f"{model}: {', '.join(f'{r:.3f}' for r in runs)} s a video (bench, {args.videos} videos a run)",
                  flush=True)
            profiles[model] = {**as_entry(timed[-1]), "seconds_per_video": round(statistics.mean(runs), 4),
                               "videos": args.videos * args.repeats, "device": device,
                               "source": f"{timed[-1].source}, --speed-only: the mean of {args.repeats} runs "
                                         f"({', '.join(f'{r:.3f}' for r in runs)} s a video; {load_})"}
            continue
        images = info.image_condition == "pipeline" or model.endswith("-i2v")
        runs = []
        for run in range(args.repeats):
            seconds, shape = measure(model, args.videos, images, run)
            runs.append(seconds)
            print(f"{model} run {run + 1}: {seconds:.3f} s a video ({args.videos} videos, {shape.width}x"
                  f"{shape.height}, {shape.frames} frames, {shape.steps} steps, guidance {shape.guidance})",
                  flush=True)
        each = ", ".join(f"{r:.3f}" for r in runs)
        profiles[model] = as_entry(Profile(
            model=model, width=shape.width, height=shape.height, frames=shape.frames, steps=shape.steps,
            guidance=shape.guidance, seconds_per_video=round(statistics.mean(runs), 4),
            videos=args.videos * args.repeats, batch=min(args.videos, Settings.from_env({}).worker.max_batch),
            device=device, measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            source=f"scripts/measure_profiles.py: `reelbatch run`, {args.videos} videos at the registration's "
                   f"defaults, the ledger's seconds a video, the mean of {args.repeats} runs ({each}; {load_})"))
    args.out.write_text(json.dumps(profiles, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
