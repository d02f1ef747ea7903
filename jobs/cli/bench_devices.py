"""`reelbatch bench cold`, `bench envelope` and `bench parallel`: what a worker's device gives it - how soon a new
worker stores its first video (jobs.bench.cold), how large a batch fits its memory (jobs.bench.envelope), and one
video across several ranks (jobs.bench.parallel) - printed as tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table

from jobs.cli.bench_options import JsonOption, PresetOption, StepsOption, chosen_preset
from jobs.cli.console import err, fail, out
from jobs.errors import ReelbatchError, UsageError
from jobs.settings import Settings


def cold(
    model: Annotated[str, typer.Option("--model", help="A registered model.")] = "tiny",
    resolution: Annotated[str, typer.Option("--resolution", help="WIDTHxHEIGHT of its one video.")] = "64x64",
    steps: Annotated[int, typer.Option("--steps", min=1, max=200, help="Denoising steps.")] = 2,
    json_: JsonOption = False,
) -> None:
    """Three fresh `reelbatch run`s of one video, each a new machine (its own folders and Inductor cache): compile
    off, compile on with an empty warm-start store, and compile on from the bundle the second stored; seconds from
    process start to the video stored, and the ratio."""
    from jobs.bench.cold import run_cold

    try:
        r = run_cold(model, resolution, steps, on_side=lambda name: err.print(f"bench cold: {name}"))
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"model": r.model, "sides": [vars(s) for s in r.sides], "speedup": r.speedup,
                                   "identical": r.identical}))
        return
    table = Table(title=f"bench cold: {r.model} {resolution}, {steps} steps, one video")
    for column in ("side", "process start -> video stored", "bundles stored", "MP4 sha256"):
        table.add_column(column)
    for s in r.sides:
        table.add_row(s.name, f"{s.seconds:.1f} s", str(s.bundles), s.sha256[:12])
    out.print(table)
    out.print(f"from the bundle: {r.speedup:.2f}x sooner than cold with compile on; "
              f"MP4s {'identical' if r.identical else 'DIFFERENT'}")


def envelope(
    model: Annotated[Optional[str], typer.Option("--model", help="A registered model.")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="Or a bench preset's model (e.g. cpu).")] = None,
    resolution: Annotated[Optional[str], typer.Option(
        "--resolution", help="WIDTHxHEIGHT the sizes are planned around (default: the model's).")] = None,
    frames: Annotated[Optional[int], typer.Option("--frames", min=1, max=1001,
                                                  help="Frames a pass (default: the model's).")] = None,
    record: Annotated[bool, typer.Option("--record/--no-record",
                                         help="Keep it in the database for workers and submit.")] = True,
    json_: JsonOption = False,
) -> None:
    """Measure peak memory on this device at sizes around the model's shape (batch 1 and 2, wider, longer), fit the
    line (a fixed part, per latent token, per frame pixel), check it on three sizes the fit never saw, and keep the
    envelope: workers then take at most the batch of each shape that leaves 20% of memory free, and submit refuses a
    video that fits no device measured."""
    from jobs.bench.envelope import model_info, run_envelope

    settings = Settings.from_env()
    try:
        width = height = None
        if resolution is not None:
            width, height = _resolution(resolution)
        info = model_info(settings, model, preset)
        err.print(f"bench envelope: measuring {info.name} (a child process; the first size loads the model)")
        r = run_envelope(settings, info, width, height, frames, record)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(r.to_dict()))
        return
    e = r.envelope
    out.print(f"{e.model} on {e.device}: {e.resident_bytes / 2**20:.0f} MiB resident; a batch's peak = "
              f"{e.fixed_bytes / 2**20:.1f} MiB + {e.per_token_bytes / 2**10:.2f} KiB a latent token + "
              f"{e.per_pixel_bytes / 2**10:.2f} KiB a frame pixel; budget {e.budget_bytes / 2**30:.2f} GiB "
              f"({1 - e.spare:.0%} of {e.memory_bytes / 2**30:.1f} GiB less resident)")
    table = Table(title="measured peaks (MiB)")
    for column in ("size", "tokens", "measured", "predicted", "error", "used for"):
        table.add_column(column)
    for p in r.fitted:
        table.add_row(_size(p), f"{p.batch * p.tokens:,}", f"{p.peak_bytes / 2**20:.1f}",
                      f"{e.predict(p.batch, p.tokens, p.width, p.height) / 2**20:.1f}", "", "fit")
    for h in r.held:
        p = h.point
        table.add_row(_size(p), f"{p.batch * p.tokens:,}", f"{p.peak_bytes / 2**20:.1f}",
                      f"{h.predicted / 2**20:.1f}", f"{h.error:+.1%}", "held out")
    out.print(table)
    for failed in r.failed:
        out.print(f"did not fit: {failed}")
    out.print(f"held out: worst error {r.worst:.1%} over {len(r.held)} sizes; largest batch: " + ", ".join(
        f"{p.width}x{p.height} {p.frames} frames: {n}" for p, n in r.largest()))
    out.print("kept in the database for workers and submit" if r.recorded else "not kept (--no-record)")


def _size(p) -> str:
    return f"{p.batch} x {p.width}x{p.height}, {p.frames} frames"


def _resolution(text: str) -> tuple[int, int]:
    try:
        width, height = (int(n) for n in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--resolution: expected WIDTHxHEIGHT, e.g. 128x128, got {text!r}") from None
    if width < 1 or height < 1:
        raise UsageError(f"--resolution: sides must be at least 1, got {text!r}")
    return width, height


def parallel(
    preset: PresetOption = "small",
    ranks: Annotated[str, typer.Option(
        "--ranks", help="Comma-separated layouts, each a side: U (Ulysses on U ranks), UxC (C 2: CFG parallel "
                        "too, U x C ranks) or UxCxR (Ring on R ranks too), e.g. 2,1x2,2x2,1x1x2.")] = "2",
    videos: Annotated[int, typer.Option("--videos", min=1, max=100, help="Videos a side, one at a time.")] = 4,
    steps: StepsOption = None,
    json_: JsonOption = False,
) -> None:
    """The preset's model rendering the same videos on one rank and on each layout of --ranks (engine.parallel;
    gloo on a CPU, nccl on GPUs): seconds a video, peak memory per rank, speedup, efficiency, and whether every
    side's frames are the bytes of one rank at its threads a rank (with a CFG-parallel side, every side runs the two
    passes as two calls)."""
    from engine.models.envelope import tokens
    from engine.models.shape_rules import rules_of
    from engine.parallel import Layout, problem
    from jobs.bench.parallel import run_parallel
    from jobs.bench.sides import bench_model

    settings = Settings.from_env()
    try:
        layouts = [_layout(text) for text in ranks.split(",")]
    except ValueError:
        fail(UsageError(f"--ranks: comma-separated layouts, U, UxC or UxCxR with U and R of 1 or more, C of 1 or 2 "
                        f"and at least 2 ranks each, got {ranks!r}"))
    try:
        chosen = chosen_preset(preset, steps)
        info = bench_model(chosen, settings.engine.cache_dir)
        heads = json.loads((info.path / "transformer" / "config.json").read_text())["num_attention_heads"]
        each = tokens(rules_of(info), chosen.width, chosen.height, chosen.frames)
        for (u, c, r), text in zip(layouts, ranks.split(","), strict=True):
            why = problem(Layout(u, c, r), heads, each)
            if why is not None:
                raise UsageError(f"--ranks {text}: {why} ({info.name} at {chosen.width}x{chosen.height}, "
                                 f"{chosen.frames} frames)")
        err.print(f"bench parallel: {info.name}, 1 rank then {ranks} (each side loads the model)")
        r = run_parallel(settings, info, chosen, layouts, videos)
    except ReelbatchError as exc:
        fail(exc)
    data = r.to_dict()
    if json_:
        out.print_json(json.dumps(data))
        return
    table = Table(title=f"bench parallel: {r.model} {r.shape}, {r.videos} videos a side, one at a time"
                        + ("" if r.batched_guidance else "; guidance's two passes as two calls on every side"))
    for column in ("ulysses x cfg x ring", "threads a rank", "s a video", "speedup", "efficiency", "peak RSS MB a rank",
                   "one rank's bytes"):
        table.add_column(column)
    for s in data["sides"]:
        table.add_row(f"{s['ulysses']} x {s['cfg']} x {s['ring']}", str(s["threads"]), f"{s['seconds_per_video']:.2f}",
                      f"{s['speedup']:.2f}x",
                      f"{s['efficiency']:.2f}", ", ".join(f"{m:.0f}" for m in s["peak_rss_mb"]),
                      "yes" if s["identical"] else "no (Ring: not bit-exact)" if s["ring"] > 1 else "NO")
    out.print(table)


def _layout(text: str) -> tuple[int, int, int]:
    parts = text.strip().split("x")
    if not 1 <= len(parts) <= 3:
        raise ValueError(text)
    u, c, r = (int(p) for p in parts + ["1"] * (3 - len(parts)))
    if u < 1 or r < 1 or c not in (1, 2) or u * c * r < 2:
        raise ValueError(text)
    return u, c, r
