"""Outcomes that can take several forms are typed values handled exhaustively: a store attempt's outcome
(jobs.render.store), why a render stopped (jobs.render.keeper.Stop, handled in jobs.render.failures) and what a webhook
POST came to (jobs.notify.send). A case left unhandled must fail type checking, not production (the "lost" outcome
once fell into the success branch), so mypy checks the modules that match on them."""

import re
import subprocess
import sys

from tests.conftest import REPO

MODULES = ["jobs/render/store.py", "jobs/render/checks.py", "jobs/render/batch.py", "jobs/render/failures.py",
           "jobs/render/keeper.py", "jobs/notify/send.py"]


def test_every_outcome_is_handled_where_it_is_matched():
    proc = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=skip", "--ignore-missing-imports",
                           "--no-error-summary", *MODULES], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_fails_when_an_outcome_is_left_unhandled(tmp_path):
    """The same check on a copy of jobs/render/store.py with the lease-lost case removed: mypy must refuse it."""
    source = (REPO / "jobs/render/store.py").read_text(encoding="utf-8")
    start = source.index("            case LeaseLost():")
    end = source.index("            case Checkpointed(key):")
    broken = tmp_path / "store.py"
    broken.write_text(source[:start] + source[end:], encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=skip", "--ignore-missing-imports",
                           "--no-error-summary", str(broken)], cwd=REPO, capture_output=True, text=True, timeout=300)
    # Alone, the copy's imports are unknown to mypy (Any), so the unhandled type reads "Any | LeaseLost".
    assert proc.returncode == 1 and re.search(r'incompatible type "(Any \| )?LeaseLost"', proc.stdout), \
        proc.stdout + proc.stderr
