"""This process's name, as leases, worker sessions and webhook attempts record it: `host:pid`. A leaf, so that the
claims, the worker and the notifier each name the process without importing one another."""

from __future__ import annotations

import os
import socket


def worker_id() -> str:
    """This process, as leases, worker sessions and webhook attempts name it: `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"
