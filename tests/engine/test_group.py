"""The engine of a worker of several ranks (engine.group) under what the job path asks of it: tiny Wan 2.2 A14B's two
experts with the idle one offloaded (the expert swap on every rank), a long tiny video rendered in chunks and
stitched (each chunk's conditioning sent to the other rank), with batched guidance and the text cache on; 2 Ulysses
ranks give the frames of one process at the same threads a rank, and the other rank's process is gone after close.

Each side runs in a fresh interpreter (`python -c`): the group's rank 0 is that process (as the worker process is)
and starts rank 1 itself."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.engine.wan22 import A14B, write_models_file

SCRIPT = """
import hashlib, json, os, sys
from pathlib import Path
import torch
from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.types import RenderBatch, RenderRequest, Shape

cache, models, ulysses = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
config = EngineConfig(cache_dir=cache, ulysses=ulysses)
registry = load_registry(models)
if ulysses > 1:
    from engine.group import GroupEngine
    engine = GroupEngine(config, registry, timeout_s=120)
else:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))  # as each of 2 ranks runs (engine.group.Group)
    engine = Engine(config, registry)
sha = lambda a: hashlib.sha256(a.tobytes()).hexdigest()
found = {}
requests = (RenderRequest(1, "a red circle", None, 5), RenderRequest(2, "a blue square", "blurry", 6))
out = engine.render(RenderBatch(Shape("a14b", 64, 48, 9, 4, 4.0), requests))
found["a14b"] = [sha(v.frames) for v in out]
info = registry.get("tiny")
chunk_plan = info.chunk_plan(57)  # 57 frames in windows of 33: two chunks sharing 2 latent frames
video, chunks = engine.render_long(Shape("tiny", 64, 64, 33, 3, 5.0), RenderRequest(3, "a green circle", None, 7),
                                   chunk_plan)
found["long"] = {"chunks": len(chunks), "frames": sha(video.frames), "error": str(video.error)}
if ulysses > 1:
    followers = engine.group.procs
    engine.group.close()
    found["closed"] = [p.exitcode for p in followers]
print("RESULT " + json.dumps(found))
"""


def side(tmp_path, model_cache, ulysses: int) -> dict:
    models = write_models_file(tmp_path, model_cache, a14b="offload_idle_expert: true")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model_cache), str(models), str(ulysses)], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env={"PATH": "/usr/bin:/bin",
                                                                            "PYTHONPATH": str(REPO),
                                                                            "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def test_two_ranks_render_two_experts_and_a_long_video_as_one_process_does(tmp_path, model_cache):
    one = side(tmp_path, model_cache, 1)
    two = side(tmp_path, model_cache, 2)
    assert one["long"]["chunks"] == 2 and one["long"]["error"] == "None"
    assert len(set(one[A14B])) == 2
    assert two[A14B] == one[A14B] and two["long"] == one["long"]
    assert two["closed"] == [0]  # rank 1 quit when told
