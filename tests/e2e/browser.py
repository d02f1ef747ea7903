"""Debian's headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages
ended by a NUL byte, read by Chromium on fd 3 and written on fd 4), so a test can open a page, type into it and read
its DOM as it changes, with nothing but the standard library."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path


class Browser:
    def __init__(self, chromium: str, profile: Path):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds():  # in the child: fd 3 reads our commands, fd 4 writes Chromium's answers (kept by pass_fds)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w)]  # neither is 3 or 4
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", "--remote-debugging-pipe",
             "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer, self._id = b"", 0
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(t["targetId"] for t in targets if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=page, flatten=True)["sessionId"]

    def send(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise AssertionError("Chromium closed its DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise AssertionError(f"{method}: {answer['error']}")
                return answer["result"]

    def open(self, url: str) -> None:
        self.send("Page.navigate", self.session, url=url)
        self.until("document.readyState === 'complete'", timeout=30)

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        found = self.send("Runtime.evaluate", self.session, expression=expression, returnByValue=True,
                          awaitPromise=True)
        if "exceptionDetails" in found:
            raise AssertionError(f"{expression}: {found['exceptionDetails']}")
        return found["result"].get("value")

    def until(self, expression: str, timeout: float, interval: float = 0.25):
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {expression}")
            time.sleep(interval)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
