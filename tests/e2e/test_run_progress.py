"""`reelbatch run`'s bar as a person sees it: a failed video is shown as failed, not only counted as ended."""

from engine.models.registry import TOY_WEIGHTS
from tests.e2e.conftest import Cli

# `toy` whose only check is a long video's seams, held to 0: the video of two chunks fails it (on_fail: fail), the
# one-window video has no seam to fail. (A shape the model cannot render is refused at submit: tests/jobs/
# test_submit_shapes.py.)
SEAMLESS = (f"toy-seamless:\n  path: {TOY_WEIGHTS}\n  max_frames: 9\n  chunk_condition: clean\n"
            "  max_sequence_length: 64\n"
            "  defaults: {width: 32, height: 32, fps: 8, duration_s: 1.0, steps: 20, guidance: 2.0}\n"
            "  checks: {max_seam: 0, max_blank: 1, min_motion: 0, min_structure: 0}\n")


def test_runs_bar_names_a_failed_video(tmp_path, cli):
    models = tmp_path / "models.yaml"
    models.write_text(SEAMLESS)
    manifest = tmp_path / "f.yaml"
    manifest.write_text("name: f\nmodel: toy-seamless\nchecks: {on_fail: fail}\nvideos:\n"
                        "  - {id: ok0, prompt: a red square moving left on a black background}\n"
                        "  - {id: long1, prompt: a red square moving left on a black background, duration_s: 2}\n")
    proc = Cli(tmp_path, {**cli.env, "REELBATCH_MODELS": str(models)})("run", str(manifest), check=False)
    assert proc.returncode == 1, proc.stderr
    assert "long1: checks failed: seam " in proc.stdout, proc.stdout
    bar = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.startswith("rendering f")]
    assert bar and bar[-1].startswith("rendering f (1 failed) ") and " 2/2 " in bar[-1], proc.stderr
