"""`reelbatch bench quality --model M --draws N`: a distilled model's gate on several fresh held-out draws, and how
often it passed (issue 46: what a new user will see, not one draw's verdict)."""

import json
import os
import subprocess
import sys

import pytest

from engine.levers import gates
from jobs.quality.distilled import draws_summary


def _gate(student: dict, teacher: dict, failures: list[str], sample: str) -> gates.Gate:
    return gates.Gate(model="toy-fast", identity="x", setting=gates.DISTILLED, count=1200, batch=8, speedup=10.0,
                      psnr_db_min=20.0, psnr_db_mean=22.0, ssim_min=0.5, adherence=student, exact_adherence=teacher,
                      measured_at="2026-12-07T00:00:00+00:00", failures=failures, teacher="toy", sample=sample)


def test_the_summary_of_three_draws_worked_by_hand():
    teacher = {"colour": 0.99, "shape": 0.83, "direction": 0.97}
    draws = [_gate({"colour": 0.99, "shape": 0.82, "direction": 0.97}, teacher, [], "a"),
             _gate({"colour": 0.98, "shape": 0.80, "direction": 0.96}, {**teacher, "shape": 0.83}, [], "b"),
             _gate({"colour": 0.97, "shape": 0.78, "direction": 0.96}, {**teacher, "shape": 0.81},
                   ["shape 78.0% is more than 2% below the teacher's 81.0%"], "c")]
    s = draws_summary(draws)
    assert (s["draws_made"], s["passed_draws"], s["samples"]) == (3, 2, ["a", "b", "c"])
    shape = s["attributes"]["shape"]
    # gaps -1, -3, -3 points: mean -7/3, sample sd sqrt(((4/3)^2 + 2 (2/3)^2) / 2) = sqrt(4/3) = 1.1547
    assert shape["gap_mean"] == pytest.approx(-2.3333, abs=1e-4)
    assert shape["gap_sd"] == pytest.approx(1.1547, abs=1e-4)
    assert (round(shape["gap_min"], 6), round(shape["gap_max"], 6)) == (-3.0, -1.0)
    assert shape["teacher"] == pytest.approx(82.3333, abs=1e-4) and shape["student"] == pytest.approx(80.0)
    colour = s["attributes"]["colour"]  # gaps 0, -1, -2
    assert (round(colour["gap_mean"], 6), round(colour["gap_sd"], 6)) == (-1.0, 1.0)
    assert set(s["attributes"]) == {"colour", "shape", "direction"}  # only what every draw measured
    assert s["failures"][2] == ["shape 78.0% is more than 2% below the teacher's 81.0%"]


def _cli(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)


@pytest.fixture
def env(tmp_path):
    return {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
            "REELBATCH_CACHE_DIR": str(tmp_path / "cache")}


def test_two_fresh_draws_are_judged_and_the_last_recorded(tmp_path, env):
    proc = _cli(["bench", "quality", "--model", "toy-fast", "--count", "8", "--draws", "2", "--json"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["draws_made"] == 2 and len(r["draws"]) == 2 and r["count"] == 8
    first, second = (d["gate"]["sample"] for d in r["draws"])
    assert first.startswith("toy held-out draw, entropy ") and second.startswith("toy held-out draw, entropy ")
    assert first != second, "each draw has its own entropy"
    assert r["passed_draws"] == sum(d["gate"]["passed"] for d in r["draws"])
    (recorded,) = gates.load(tmp_path / "cache").values()
    assert recorded["sample"] == second


@pytest.mark.parametrize("args, said", [
    (["--model", "toy", "--draws", "2"], "--draws 2: 'toy' is not a distilled registration"),
    (["--model", "toy-fast", "--draws", "3", "--entropy", "7"], "--draws 3: --entropy names one draw"),
])
def test_draws_that_cannot_be_measured_are_refused_before_rendering(tmp_path, env, args, said):
    proc = _cli(["bench", "quality", *args], tmp_path, env)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "cache" / gates.GATES_FILE).exists()
