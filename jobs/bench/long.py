"""`reelbatch bench long`: one prompt at 1x and at N x the model's window, chunked and (where it fits) full length.

Each case runs in a fresh process (spawned), so its peak memory is its own: the process loads the model, renders
one untimed 1x video (thread pools, allocator, caches), then the case, timed REPEATS times (the fastest kept). Peak
memory is the process's peak
RSS on a CPU and torch's peak allocation on a GPU. The chunked path is the engine's chunk loop (Engine.render_long:
the same chunks, conditioning, stitch and decode the workers run unit by unit); full length is one pass over all
the frames, which the model was not trained for and whose attention grows with the square of the length.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
import traceback
from dataclasses import dataclass, replace

import torch

from engine.engine import Engine
from engine.models.registry import ModelInfo, Registry
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.bench.presets import Preset, prompts
from jobs.bench.sides import bench_model
from jobs.settings import Settings

# Each case is timed this many times and its fastest run kept: a toy video takes a third of a second, and one timing
# of that moves by 20% on a shared machine.
REPEATS = 3


@dataclass(frozen=True)
class Case:
    name: str
    frames: int
    chunked: bool


def run_long(preset: Preset, settings: Settings, multiple: int = 4) -> dict:
    info = replace(bench_model(preset, settings.engine.cache_dir), max_frames=preset.frames)
    window = preset.frames
    long_frames = multiple * (window - 1) + 1
    cases = [Case("chunked_1x", window, True), Case(f"chunked_{multiple}x", long_frames, True),
             Case(f"full_{multiple}x", long_frames, False)]
    prompt = prompts(1, preset.model)[0]
    results = {case.name: _in_child(settings, info, preset, prompt, case) for case in cases}
    one, many, full = (results[c.name] for c in cases)
    chunks_one, chunks_many = info.chunk_plan(window).chunks, info.chunk_plan(long_frames).chunks
    out = {
        "preset": preset.name, "device": str(settings.engine_config().torch_device()),
        "window_frames": window, "frames": {"1x": window, f"{multiple}x": long_frames},
        "chunks": {"1x": chunks_one, f"{multiple}x": chunks_many},
        "time_ratio": many["seconds"] / one["seconds"],
        "chunk_ratio": chunks_many / chunks_one,
        "peak_memory_ratio": many["peak_mb"] / one["peak_mb"],
        "seam_score": many["seam_score"],
        "cases": results,
    }
    out["time_ratio_over_chunk_ratio"] = out["time_ratio"] / out["chunk_ratio"]
    if full.get("error") is None:
        out["full_length"] = {"time_ratio": full["seconds"] / one["seconds"],
                              "peak_memory_ratio": full["peak_mb"] / one["peak_mb"]}
    else:
        out["full_length"] = {"error": full["error"]}
    return out


def _in_child(settings: Settings, info: ModelInfo, preset: Preset, prompt: str, case: Case) -> dict:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    proc = context.Process(target=_case, args=(settings, info, preset, prompt, case, results), daemon=True)
    proc.start()
    result = results.get(timeout=3600)
    proc.join(60)
    if result.get("error") and case.chunked:
        raise RuntimeError(f"bench long, {case.name}: {result['error']}")
    return result


def _case(settings: Settings, info: ModelInfo, preset: Preset, prompt: str, case: Case, results) -> None:
    try:
        engine = Engine(settings.engine_config(), Registry({info.name: info}))
        window = Shape(info.name, preset.width, preset.height, preset.frames, preset.steps, preset.guidance)
        request = RenderRequest(0, prompt, None, 1234)
        engine.render(RenderBatch(window, (replace(request, seed=99),)))  # warm-up, untimed
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds, seam = float("inf"), None
        for _ in range(REPEATS):
            started = time.perf_counter()
            if case.chunked:
                video, _ = engine.render_long(window, request, info.chunk_plan(case.frames))
                seam = video.seam_score
            else:
                (video,) = engine.render(RenderBatch(replace(window, frames=case.frames), (request,)))
            if cuda:
                torch.cuda.synchronize()
            seconds = min(seconds, time.perf_counter() - started)
        if video.error:
            raise RuntimeError(video.error)
        peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else \
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        results.put({"frames": case.frames, "seconds": seconds, "peak_mb": peak, "seam_score": seam,
                     "stages": dict(video.stages), "error": None})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent (full length may simply not fit)
        results.put({"frames": case.frames, "error": f"{type(exc).__name__}: {exc}",
                     "detail": traceback.format_exc()[-2000:]})
