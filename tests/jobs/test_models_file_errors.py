"""A models file with a key no registration knows stops every command that reads it: one line naming the file, the
line, the model and the key, exit 2, no traceback (engine.models.keys)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("args", [["submit", "m.yaml"], ["estimate", "m.yaml"], ["run", "m.yaml"], ["worker"],
                                  ["quality", "--model", "tiny"]])
def test_a_typo_in_the_models_file_stops_the_command_with_one_line(tmp_path, args):
    models = tmp_path / "models.yaml"
    models.write_text("wan:\n  path: /models/wan\n  precison: int8\n")
    (tmp_path / "m.yaml").write_text("name: a\nmodel: tiny\nvideos:\n  - {id: a, prompt: a red circle}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "REELBATCH_MODELS": str(models),
           "REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'w.db'}", "REELBATCH_BROKER_URL": "redis://127.0.0.1:1/0"}
    proc = subprocess.run([sys.executable, "-m", "jobs", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (f"REELBATCH_MODELS: {models}:3: model 'wan': unknown key 'precison' "
                           "(did you mean 'precision'?)\n")
    if args[0] in ("submit", "estimate", "run"):
        assert not (tmp_path / "w.db").exists(), "the manifest's run: nothing written"
