"""`reelbatch bench precision MODE`: exact mode, the native engine and each mode side by side
(jobs.bench.precision), printed as a table or JSON."""

from __future__ import annotations

import json

from rich.progress import Progress, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from jobs.cli.console import err, fail, out, progress_text
from jobs.errors import ReelbatchError
from jobs.settings import Settings


def bench_precision(preset, modes: list[str], videos: int | None, json_: bool, text_encoder: str | None = None) -> None:
    with Progress(progress_text(), TimeElapsedColumn(), console=err, transient=True, disable=json_) as bar:
        task = bar.add_task(f"bench precision {preset.name}")
        try:
            from jobs.bench.precision import run_precision_bench  # here, not at the top: torch only when rendering

            result = run_precision_bench(preset, Settings.from_env(), modes, videos,
                                         on_side=lambda name: bar.update(task, description=f"rendering {name}"),
                                         text_encoder=text_encoder)
        except ReelbatchError as exc:
            fail(exc)
    if json_:
        out.print_json(json.dumps(result))
    else:
        print_precision_bench(result)


def print_precision_bench(r: dict) -> None:
    s = r["shape"]
    out.print(Text(f"bench precision {r['preset']}", style="bold"),
              f"{r['model']} on {r['device']} ({r['device_name']}): {s['videos']} videos of {s['width']}x{s['height']},"
              f" {s['frames']} frames, {s['steps']} steps, batches of {s['batch']}", highlight=False)
    sides = r["sides"]
    native = next(x for x in sides if x["name"] == "native")
    table = Table("side", "precision", "render s", "speed", "load s", "weights MB", "of fp32", "text encoder",
                  "text MB", "of fp32", "peak MB", "PSNR min/mean", box=None)
    fp32 = next((x["weight_bytes"] for x in sides if x["precision"] == "fp32"), None)
    text_fp32 = next((x["text_encoder_bytes"] for x in sides if x["text_encoder_precision"] == "fp32"), None)
    for x in sides:
        psnr = "exact" if x["psnr_db_min"] is None else f"{x['psnr_db_min']:.1f}/{x['psnr_db_mean']:.1f}"
        table.add_row(x["name"], x["precision"], f"{x['render_s']:.2f}", f"{native['render_s'] / x['render_s']:.2f}x",
                      f"{x['load_s']:.2f}", f"{x['weight_bytes'] / 1e6:.1f}",
                      "" if fp32 is None else f"{x['weight_bytes'] / fp32:.2f}x", x["text_encoder_precision"],
                      f"{x['text_encoder_bytes'] / 1e6:.1f}",
                      "" if text_fp32 is None else f"{x['text_encoder_bytes'] / text_fp32:.2f}x", f"{x['peak_mb']:.0f}",
                      psnr)
    out.print(table)
    for x in sides:
        if x["gate"] not in ("passed", "native"):
            out.print(f"{x['name']}: speed only; {x['gate']}", highlight=False, markup=False)
