"""Where an uploaded manifest is written while the use cases read it (they read files, as the CLI does): a private
folder per request under the service's upload folder, removed when the request ends. `serve` empties the upload
folder when it starts (clear), so what a killed server left mid-upload is gone at the next start, never kept in a
temporary folder nothing cleans. Multipart parts arrive through Starlette's spooled files (memory, then an unlinked
temporary file), which vanish with the process."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def clear(root: Path) -> None:
    """Empty `root` (made if missing): a server starting owns it, so whatever is there was left by a killed one."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def folder(root: Path | None) -> tempfile.TemporaryDirectory:
    """A private folder for one upload (a context manager giving its path), under `root` (None: the system's
    temporary folder)."""
    return tempfile.TemporaryDirectory(prefix="upload-", dir=root)
