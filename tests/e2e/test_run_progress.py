"""`reelbatch run`'s bar as a person sees it: a failed video is shown as failed, not only counted as ended."""


def test_runs_bar_names_a_failed_video(tmp_path, cli):
    manifest = tmp_path / "f.yaml"
    # toy renders 32x32; at 32x2048 its transformer's position table runs out (UnrenderableInput, first attempt).
    manifest.write_text("name: f\nmodel: toy\ndefaults: {steps: 2}\nvideos:\n  - {id: ok0, prompt: a red square}\n"
                        "  - {id: tall1, prompt: a red square, resolution: 32x2048}\n")
    proc = cli("run", str(manifest), check=False)
    assert proc.returncode == 1, proc.stderr
    bar = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.startswith("rendering f")]
    assert bar and bar[-1].startswith("rendering f (1 failed) ") and " 2/2 " in bar[-1], proc.stderr
