"""Whether a run's names fit where it is stored: every key reelbatch writes for the run and its videos, under the
run's output, within the store's limits in bytes (storage.local: a 255-byte file name, counting the temporary name a
file is written under first, and a 4,096-byte path; storage.s3: a 1,024-byte key, prefix included).

Checked when a run is submitted, and again for the names that `--new-run` and schedules make, so that no accepted
video fails at store time after it has rendered.
"""

from __future__ import annotations

from jobs.manifest.keys import longest_video_keys, result_keys
from jobs.manifest.values import shown
from storage.base import TooLong, utf8_len, worst
from storage.stores import key_too_long


def run_name_problem(output: str, run_name: str) -> str | None:
    """Why the run's own objects (its folder, its result files) cannot be stored under `output`, or None."""
    over = _run_over(output, run_name)
    return None if over is None else _message(output, "a run name", run_name, over)


def video_id_problem(output: str, run_name: str, video_id: str, chunks: int) -> str | None:
    """Why a video's objects cannot be stored under `output` in run `run_name`, or None."""
    keys = longest_video_keys(run_name, video_id, chunks)
    over = worst([t for key in keys if (t := key_too_long(output, key)) is not None])
    return None if over is None else _message(output, "an id", video_id, over, run_name)


def check_room(output: str, output_at: tuple[int, str], run_name: str, name_at: tuple[int, str], videos, seen,
               report) -> None:
    """A manifest's run name and ids against its output, each problem at the line of the name (or of the output,
    when the output leaves no room for any run). `seen`: id -> (line of the id, field prefix), from load."""
    over = _run_over(output, "r")
    if over is not None:
        report(*output_at, f"{shown(output)} leaves no room for a run: even with a one-letter run name, {over}")
        return
    problem = run_name_problem(output, run_name)
    if problem is not None:
        report(*name_at, f"{shown(run_name)} {problem}")
        return  # every id would fail with it
    for video in videos:
        problem = video_id_problem(output, run_name, video.id, video.chunks)
        if problem is not None:
            line, prefix = seen[video.id]
            report(line, prefix + "id", f"{shown(video.id)} {problem}")


def _run_over(output: str, run_name: str) -> TooLong | None:
    return worst([t for key in result_keys(run_name) if (t := key_too_long(output, key)) is not None])


def _message(output: str, what: str, name: str, over: TooLong, run_name: str | None = None) -> str:
    size = utf8_len(name)
    room = size - over.excess
    run = "" if run_name is None else f" in run {shown(run_name)}"
    limit = (f"{what} there may be at most {room:,} bytes" if room > 0
             else "the output prefix and run name leave no room for it")
    return f"is {size:,} bytes in UTF-8; stored under {shown(output)}{run}, {over}: {limit}"
