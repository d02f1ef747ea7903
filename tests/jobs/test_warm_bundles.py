"""Warm-start bundles without a compile: the key changes with everything that makes compiled code valid, a bundle
round-trips through a store, the first one published stays, and a bundle that would write outside its folder is
refused. (The job path, with compile on and two machines: tests/e2e/test_warm_start.py.)"""

from __future__ import annotations

import dataclasses
import io
import tarfile

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.types import Shape
from jobs.render import warm_bundles

SHAPE = Shape("tiny", 64, 64, 9, 2, 5.0)


def test_the_key_names_the_model_and_changes_with_what_makes_the_code_valid(tmp_path):
    engine = Engine(EngineConfig(cache_dir=tmp_path, compile=True), Registry())
    key = warm_bundles.bundle_key(engine, SHAPE)
    assert key.startswith("tiny/") and key.endswith(".tar") and len(key) == len("tiny/") + 32 + len(".tar")
    assert warm_bundles.bundle_key(engine, SHAPE) == key
    # The cache folder is where a machine keeps things, not what the code is: the same key.
    elsewhere = Engine(EngineConfig(cache_dir=tmp_path / "other", compile=True), Registry())
    assert warm_bundles.bundle_key(elsewhere, SHAPE) == key
    others = {warm_bundles.bundle_key(engine, dataclasses.replace(SHAPE, width=96)),
              warm_bundles.bundle_key(engine, dataclasses.replace(SHAPE, steps=4)),
              warm_bundles.bundle_key(Engine(EngineConfig(cache_dir=tmp_path, compile=True, fast_vae_norm=False),
                                             Registry()), SHAPE)}
    assert len(others) == 3 and key not in others
    assert warm_bundles.device_identity("cpu").startswith("cpu ")


def test_a_bundle_round_trips_and_the_first_one_published_stays(tmp_path):
    folder = tmp_path / "inductor"
    (folder / "fxgraph" / "ab").mkdir(parents=True)
    (folder / "fxgraph" / "ab" / "entry").write_bytes(b"compiled graph")
    (folder / "locks").mkdir()
    (folder / "locks" / "x.lock").write_bytes(b"")
    uri = f"file://{tmp_path / 'warm'}/"
    assert warm_bundles.publish(uri, "tiny/k.tar", folder) is True
    (folder / "fxgraph" / "ab" / "entry").write_bytes(b"another worker's graph")
    assert warm_bundles.publish(uri, "tiny/k.tar", folder) is False, "a bundle is there: it stays"
    fresh = tmp_path / "fresh"
    assert warm_bundles.fetch(uri, "tiny/k.tar", fresh) is True
    assert (fresh / "fxgraph" / "ab" / "entry").read_bytes() == b"compiled graph"
    assert not (fresh / "locks").exists(), "lock files are not packed"
    assert warm_bundles.fetch(uri, "tiny/none.tar", tmp_path / "none") is False


def test_a_bundle_that_would_write_outside_its_folder_is_refused(tmp_path):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        member = tarfile.TarInfo("../escaped")
        member.size = 3
        tar.addfile(member, io.BytesIO(b"bad"))
    (tmp_path / "warm" / "tiny").mkdir(parents=True)
    (tmp_path / "warm" / "tiny" / "evil.tar").write_bytes(data.getvalue())
    into = tmp_path / "a" / "inductor"
    assert warm_bundles.fetch(f"file://{tmp_path / 'warm'}/", "tiny/evil.tar", into) is False
    assert not (tmp_path / "a" / "escaped").exists()
