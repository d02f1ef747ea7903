"""Start-up time of the commands a person types most, measured side by side for one or more checkouts.

    python scripts/startup.py [--tree PATH ...] [--repeats 5]

Each tree (default: this one) gets a scratch folder with its own SQLite database holding the demo run, then every
command runs `--repeats` times in a fresh interpreter, alternating between trees so machine noise hits them alike; the
median wall time of each is printed. To compare with an older commit: `git worktree add /tmp/old COMMIT` and pass
`--tree /tmp/old --tree .`. Results are recorded in docs/PERFORMANCE.md ("Start-up").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = (["--help"], ["status"], ["report", "demo"], ["ledger"], ["schedule", "list"], ["submit", "DEMO"],
            ["cancel", "demo"], ["resume", "demo"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to measure (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    trees = [t.resolve() for t in args.tree or [Path(__file__).resolve().parents[1]]]
    with tempfile.TemporaryDirectory(prefix="reelbatch-startup-") as scratch:
        folders = {tree: _prepare(tree, Path(scratch) / str(i)) for i, tree in enumerate(trees)}
        times: dict[tuple[Path, str], list[float]] = {}
        for _ in range(args.repeats):
            for command in COMMANDS:
                for tree, folder in folders.items():
                    argv = [str(tree / "manifests/examples/demo.yaml") if a == "DEMO" else a for a in command]
                    started = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "jobs", *argv], cwd=folder, env=_env(tree, folder),
                                   capture_output=True, check=False)
                    times.setdefault((tree, " ".join(command)), []).append(time.perf_counter() - started)
    width = max(len(" ".join(c)) for c in COMMANDS)
    print(f"{'command':{width}}  " + "  ".join(f"{str(t)[-30:]:>30}" for t in trees) + "   (median s, "
          f"{args.repeats} runs each)")
    for command in COMMANDS:
        name = " ".join(command)
        cells = [f"{statistics.median(times[(t, name)]):30.2f}" for t in trees]
        print(f"{name:{width}}  " + "  ".join(cells))


def _env(tree: Path, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")}
    return {**env, "PYTHONPATH": str(tree), "REELBATCH_CACHE_DIR": str(folder / "cache")}


def _prepare(tree: Path, folder: Path) -> Path:
    folder.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "jobs", "submit", str(tree / "manifests/examples/demo.yaml")], cwd=folder,
                   env=_env(tree, folder), capture_output=True, check=True)
    return folder


if __name__ == "__main__":
    main()
