"""`reelbatch estimate` and `reelbatch budget`: what a manifest will cost and when it will be done, before submitting
it; and a run's cost cap changed while it runs."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Column, Table

from jobs.cli.console import ShownFeedback, fail, out
from jobs.cli.submit import JsonOpt, ManifestArg, ModelOpt, NameOpt, OutputOpt, SetOpt, options
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases import runs
from jobs.usecases.estimate import estimate_manifest

GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", min=1, max=100000, help="GPUs to finish on (default: the workers alive now).")]


def estimate(manifest: ManifestArg, name: NameOpt = None, model: ModelOpt = None, output: OutputOpt = None,
             set_: SetOpt = None, gpus: GpusOpt = None, json_: JsonOpt = False) -> None:
    """Check a manifest as `submit` does and write nothing: its videos, GPU seconds, cost (GPU, storage, egress) and
    time to finish on N GPUs, per shape and in total, each shape with the basis of its numbers."""
    try:
        data = estimate_manifest(Settings.from_env(), manifest, options(name, model, output, set_), gpus,
                                 feedback=ShownFeedback())
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(data))
    else:
        print_estimate(data)


def _money(usd: float | None) -> str:
    return "unknown" if usd is None else f"${usd:.6f}"


def print_estimate(d: dict) -> None:
    left_out = d["storage_unknown_videos"]
    part = f" ({left_out} videos unknown)" if left_out and d["cost"] and d["cost"]["storage_usd"] is not None else ""
    total = (f"{d['gpu_seconds']:.1f} GPU-s, {_money(d['cost_usd'])} (GPU {_money(d['cost']['gpu_usd'])}, storage "
             f"{_money(d['cost']['storage_usd'])}{part}, egress {_money(d['cost']['egress_usd'])}{part})"
             if d["cost_usd"] is not None else
             f"cost unknown: {d['unknown_videos']} videos have no basis (known part: {d['known']['videos']} videos, "
             f"{d['known']['gpu_seconds']:.1f} GPU-s, ${d['known']['cost_usd']:.6f})")
    out.print(f"estimate of {d['name']} ({d['model']}): {d['videos']} videos, {total}", highlight=False)
    if d["finish_s"] is not None:
        out.print(f"done in about {_duration(d['finish_s'])} on {d['gpus']} GPU(s) ({d['gpus_source']}; each busy "
                  f"{d['utilisation']:.0%} of the time; {d['queue_ahead_s']:.1f} GPU-s queued ahead"
                  + (f", and {d['queue_ahead_unknown_units']} units of unknown cost" if d["queue_ahead_unknown_units"]
                     else "") + f"): by {d['finishes_at']}", highlight=False)
    elif not d["gpus"]:
        out.print("time to finish: no worker is alive; pass --gpus N", highlight=False)
    if d["deadline"]:
        verdict = {True: "met", False: "AT RISK: it would finish after it", None: "not known"}[d["meets_deadline"]]
        out.print(f"deadline {d['deadline']}: {verdict}", highlight=False)
    if d["max_cost_usd"] is not None:
        verdict = {True: "within it", False: "OVER it: the run would stop there", None: "not known"}[d["within_budget"]]
        out.print(f"max_cost_usd ${d['max_cost_usd']:g}: {verdict}", highlight=False)
    # In a narrow terminal (80 columns) the shape wraps at its spaces; a basis and the numbers are never broken
    # mid-phrase or cut short (a bench profile's basis is two lines, so that it stays narrow).
    table = Table("shape", "videos", Column("basis", no_wrap=True), Column("GPU-s/video", no_wrap=True),
                  Column("GPU-s", no_wrap=True), Column("cost $", no_wrap=True), box=None, pad_edge=False)
    for sh in d["shapes"]:
        b = sh["basis"]
        basis = {"measured": lambda: f"measured ({b['videos']} videos, {b['runs']} runs)",
                 "fit": lambda: f"fit ({b['shapes']} shapes, {b['videos']} videos)",
                 "profile": lambda: f"{'shipped' if b['profile'].get('shipped') else 'bench'} profile\n"
                                    f"({b['profile']['device']}, x{b['work_ratio']:.3g} work)",
                 "unknown": lambda: "unknown"}[b["kind"]]()
        chunks = f" {sh['chunks']} chunks" if sh["chunks"] > 1 else ""
        per = b["gpu_seconds_per_video"]
        table.add_row(f"{sh['width']}x{sh['height']} {sh['frames']}f@{sh['fps']} {sh['steps']} steps g{sh['guidance']:g}"
                      f"{chunks}", str(sh["videos"]), basis, "" if per is None else f"{per:.2f}",
                      "" if sh["gpu_seconds"] is None else f"{sh['gpu_seconds']:.1f}",
                      "" if sh["cost_usd"] is None else f"{sh['cost_usd']:.6f}")
    out.print(table)
    if d["storage_unknown_videos"]:
        out.print(f"storage and egress unknown for {d['storage_unknown_videos']} videos (nothing of their shape "
                  "stored yet): not in the cost", highlight=False)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else (f"{minutes}m {secs:02d}s" if minutes else f"{secs}s")


def budget(run: Annotated[str, typer.Argument(help="Run name or id.")],
           usd: Annotated[str, typer.Argument(help="The run's new max_cost_usd, or `none` for no cap.")]) -> None:
    """Set a run's cost cap (max_cost_usd). Its videos the old cap cancelled go back in the queue; nothing stored
    changes."""
    try:
        change = runs.change_budget(Settings.from_env(), run, runs.parse_usd(usd))
    except ReelbatchError as exc:
        fail(exc)
    cap = change.max_cost_usd
    cap_text = "no cap" if cap is None else f"max_cost_usd ${cap:g}"
    back = f"; {change.requeued} videos cancelled for the budget are back in the queue" if change.requeued else ""
    out.print(f"run {change.name}: {cap_text} (charged ${change.charged_usd:.6f} so far){back}", highlight=False)
