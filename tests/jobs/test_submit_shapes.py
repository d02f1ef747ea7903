"""A shape the model cannot render is refused before anything is written (issue 45), by the rule its folder's own
configs give (engine.models.shape_rules): one line naming the file, line, field, value and rule, exit 2, no row.

The numbers, by hand, from the folders' config files:
- toy (engine/models/toy): vae/config.json scale_factor_spatial 4, scale_factor_temporal 2; transformer/config.json
  patch_size [1, 2, 2], rope_max_seq_len 64. A patch is 4 x 2 = 8 px, so 64 patches are 512 px: 512 renders, 528
  (66 patches) and Wan 2.1's 832 (104 patches) do not. 4 x 2 = 8 is under WanPipeline's 16, so sides are multiples
  of 16. In time: 64 latent frames at most, (64 - 1) x 2 + 1 = 127 frames a pass; 129 frames are 65 latent frames.
- tiny (built here, engine.models.tiny): AutoencoderKLWan's default 8x space, 2x2 patches, 256 rotary positions: sides in
  multiples of 8 x 2 = 16, up to 256 x 16 = 4096 px, beyond the manifest's 2048.
"""

import dataclasses
import sqlite3
import subprocess
import sys

import pytest

from engine.errors import ModelNotFound
from engine.models.file import load_registry
from engine.models.registry import TOY_WEIGHTS, Registry
from engine.models.shape_rules import TINY_RULES, read_rules
from engine.models.tiny import ensure_builtin
from jobs.manifest import ManifestError, load_manifest
from tests.conftest import REPO

pytestmark = pytest.mark.skipif("toy" not in Registry().models, reason="the toy model's weights are not in place")

PROMPT = "a red circle moving left on a black background"
NO_DEFAULTS = f"mytoy:\n  path: {TOY_WEIGHTS}\n"
WITH_DEFAULTS = (f"mytoy:\n  path: {TOY_WEIGHTS}\n  max_frames: 9\n"
                 "  defaults: {width: 32, height: 32, fps: 8, duration_s: 1, steps: 2, guidance: 2.0}\n")


class Cli:
    """`reelbatch` in its own folder, on the embedded SQLite database and broker there."""

    def __init__(self, tmp_path, models: str | None = None):
        self.folder = tmp_path
        self.db = tmp_path / "r.db"
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
                    "REELBATCH_DATABASE_URL": f"sqlite:///{self.db}", "OMP_NUM_THREADS": "1",
                    "REELBATCH_CACHE_DIR": str(tmp_path / "cache")}
        if models is not None:
            (tmp_path / "models.yaml").write_text(models)
            self.env["REELBATCH_MODELS"] = str(tmp_path / "models.yaml")

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=300)

    def manifest(self, text: str, name: str = "m.yaml") -> str:
        (self.folder / name).write_text(text)
        return name

    def rows(self) -> dict[str, int]:
        """Every table's row count (the schema's own version row left out)."""
        with sqlite3.connect(self.db) as db:
            tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                      if t != "alembic_version" and not t.startswith("sqlite_")]
            return {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


def one_video(model: str, resolution: str | None = None) -> str:
    size = "" if resolution is None else f"    resolution: {resolution}\n"
    return (f"name: shapes\nmodel: {model}\noutput: file://./out/\nvideos:\n  - id: a\n    prompt: {PROMPT}\n"
            f"{size}")


def refused(cli: Cli, args: tuple[str, ...], line: str) -> None:
    """`args` exits 2 with exactly `line`, and the database holds what it held."""
    before = cli.rows()
    proc = cli(*args)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, line + "\n", ""), proc.stderr
    assert cli.rows() == before and (before["runs"], before["videos"], before["work_units"]) == (0, 0, 0)


@pytest.fixture
def upgraded(tmp_path):
    """A Cli whose database exists (its schema made), so the rows can be counted before and after."""
    def make(models: str | None = None) -> Cli:
        cli = Cli(tmp_path, models)
        proc = cli("db", "upgrade")
        assert proc.returncode == 0, proc.stderr
        return cli
    return make


def test_the_toy_folder_without_defaults_is_refused_when_the_models_file_is_read(upgraded):
    """The reported case: the folder inherits Wan 2.1's 832x480, 104 patches wide where it has 64 positions."""
    cli = upgraded(NO_DEFAULTS)
    models = cli.folder / "models.yaml"
    line = (f"REELBATCH_MODELS: {models}:1: model 'mytoy': defaults.width: 832 (wan2.1's published default: the "
            "entry gives no defaults.width) is 104 patches, over the 64 positions of its rotary embedding (mytoy: "
            "transformer/config.json rope_max_seq_len 64, VAE factor 4 x patch 2): at most 512; give it defaults: "
            "{width: W, height: H} that fit")
    manifest = cli.manifest(one_video("mytoy"))
    for command in ("submit", "estimate"):
        refused(cli, (command, manifest), line)


def test_a_size_past_the_toy_folders_rotary_positions_is_refused_at_submit(upgraded):
    cli = upgraded(WITH_DEFAULTS)
    manifest = cli.manifest(one_video("mytoy", "32x528"))
    line = ("m.yaml:7: videos[0].resolution: height 528 in '32x528' is 66 patches, over the 64 positions of its "
            "rotary embedding (mytoy: transformer/config.json rope_max_seq_len 64, VAE factor 4 x patch 2): at most "
            "512")
    for command in ("submit", "estimate"):
        refused(cli, (command, manifest), line)


def test_the_built_in_toy_refuses_480p_and_a_side_off_its_grid(upgraded):
    cli = upgraded()
    refused(cli, ("submit", cli.manifest(one_video("toy", "480p"))),
            "m.yaml:7: videos[0].resolution: width 832 in '480p' is 104 patches, over the 64 positions of its rotary "
            "embedding (toy: transformer/config.json rope_max_seq_len 64, VAE factor 4 x patch 2): at most 512")
    refused(cli, ("submit", cli.manifest(one_video("toy", "32x40"))),
            "m.yaml:7: videos[0].resolution: height 40 in '32x40' is not a multiple of 16 (toy: VAE factor 4 x "
            "patch 2, and WanPipeline's 16)")
    # From the run's defaults, reported at their line.
    text = f"name: shapes\nmodel: toy\ndefaults:\n  resolution: 1024x32\nvideos:\n  - {{id: a, prompt: {PROMPT}}}\n"
    refused(cli, ("submit", cli.manifest(text)),
            "m.yaml:4: defaults.resolution: width 1024 in '1024x32' is 128 patches, over the 64 positions of its "
            "rotary embedding (toy: transformer/config.json rope_max_seq_len 64, VAE factor 4 x patch 2): at most 512")


def test_the_built_in_tiny_refuses_a_side_off_its_grid(upgraded):
    cli = upgraded()
    refused(cli, ("submit", cli.manifest(one_video("tiny", "100x64"))),
            "m.yaml:7: videos[0].resolution: width 100 in '100x64' is not a multiple of 16 (tiny: VAE factor 8 x "
            "patch 2)")


def test_sizes_at_the_limits_are_accepted_and_recorded(upgraded):
    cli = upgraded(WITH_DEFAULTS)
    text = (f"name: edge\noutput: file://./out/\nvideos:\n  - {{id: wide, prompt: {PROMPT}, resolution: 512x32}}\n"
            f"  - {{id: inherits, prompt: {PROMPT}}}\n")
    proc = cli("submit", cli.manifest(text), "--model", "mytoy", "--json")
    assert proc.returncode == 0, proc.stderr
    proc = cli("submit", cli.manifest(one_video("tiny", "2048x16"), "t.yaml"))
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(cli.db) as db:
        assert sorted(db.execute("SELECT key, width, height FROM videos")) == [
            ("a", 2048, 16), ("inherits", 32, 32), ("wide", 512, 32)]
        assert db.execute("SELECT count(*) FROM runs").fetchone() == (2,)


def test_a_window_past_the_rotary_positions_is_refused_when_the_models_file_is_read(tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"mytoy:\n  path: {TOY_WEIGHTS}\n  max_frames: 129\n"
                      "  defaults: {width: 32, height: 32}\n")
    with pytest.raises(ModelNotFound) as caught:
        load_registry(models)
    assert str(caught.value) == (
        f"{models}:1: model 'mytoy': max_frames: 129 frames are 65 latent frames a pass, over the 64 positions of "
        "its rotary embedding (mytoy: transformer/config.json rope_max_seq_len 64, VAE factor 2 in time): at most 127")
    models.write_text(f"mytoy:\n  path: {TOY_WEIGHTS}\n  max_frames: 127\n  defaults: {{width: 32, height: 32}}\n")
    assert load_registry(models).get("mytoy").max_frames == 127


def test_the_rules_are_the_folders_own(model_cache):
    """Read from the configs: the toy folder's as written in it, tiny's as the folder it is built into says."""
    toy = read_rules(TOY_WEIGHTS)
    assert (toy.vae_spatial, toy.vae_temporal, toy.patch, toy.rope_max_seq_len, toy.multiple) == (4, 2, (1, 2, 2),
                                                                                                  64, 16)
    assert Registry().get("toy").rules == toy
    for name in ("tiny", "tiny-i2v"):
        assert read_rules(ensure_builtin(model_cache, name)) == TINY_RULES == Registry().get(name).rules
    assert (TINY_RULES.vae_spatial, TINY_RULES.patch, TINY_RULES.rope_max_seq_len) == (8, (1, 2, 2), 256)


def test_a_registrations_own_default_size_is_checked_as_a_manifests(tmp_path):
    """A registration made in code (not read from a models file, whose defaults are checked when it is read) whose
    default size its folder cannot render: each video that inherits it is refused at its own line."""
    registry = Registry()
    toy = registry.get("toy")
    registry.models["toy"] = dataclasses.replace(toy, defaults=dataclasses.replace(toy.defaults, width=832,
                                                                                   height=480))
    path = tmp_path / "m.yaml"
    path.write_text(one_video("toy") + f"  - {{id: b, prompt: {PROMPT}, resolution: 32x32}}\n")
    with pytest.raises(ManifestError) as caught:
        load_manifest(path, registry=registry)
    ((line, field, message),) = [(i.line, i.field, i.message) for i in caught.value.issues]
    assert (line, field) == (5, "videos[0].resolution")
    assert message == ("width 832 (toy's default 832x480; the video sets none) is 104 patches, over the 64 positions "
                       "of its rotary embedding (toy: transformer/config.json rope_max_seq_len 64, VAE factor 4 x "
                       "patch 2): at most 512")
