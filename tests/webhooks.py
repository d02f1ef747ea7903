"""A real webhook receiver for tests: Python's http.server on loopback, answering each POST with the next status of a
script (then 200), and keeping every request it was sent, so a test checks deliveries from the receiving end."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int
    at: float  # time.time() when it arrived


class Receiver:
    def __init__(self, server: ThreadingHTTPServer, script: list[int], delay_s: float, location: str | None):
        self.server, self.script, self.delay_s, self.location = server, list(script), delay_s, location
        self.received: list[Received] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def accepted(self) -> list[Received]:
        return [r for r in self.received if 200 <= r.answered < 300]


@contextmanager
def receiver(script: list[int] = (), delay_s: float = 0.0, location: str | None = None) -> Iterator[Receiver]:
    """A receiver on a free loopback port: the n-th POST is answered `script[n]` (after `delay_s`), 200 past its end;
    a 3xx answer carries `location`."""
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server's name for it
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            rec = box[0]
            with rec.lock:
                status = rec.script.pop(0) if rec.script else 200
                rec.received.append(Received(self.path, dict(self.headers), body, status, time.time()))
            time.sleep(rec.delay_s)
            self.send_response(status)
            if rec.location and 300 <= status < 400:
                self.send_header("Location", rec.location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Receiver(server, list(script), delay_s, location))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box[0]
    finally:
        server.shutdown()
        server.server_close()


def signed_by(secret: str, received: Received, tolerance_s: float = 300) -> bool:
    """The receiver's own check, written here from the documented scheme rather than with reelbatch's code:
    Reelbatch-Signature is `t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`, and t is recent."""
    fields = dict(part.split("=", 1) for part in received.headers["Reelbatch-Signature"].split(","))
    expected = hmac.new(secret.encode(), fields["t"].encode() + b"." + received.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(fields["v1"], expected) and abs(received.at - int(fields["t"])) <= tolerance_s
