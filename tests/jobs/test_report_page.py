"""The HTML report of a real run (the render path of tests/jobs/clocked.py, a local store) opened in headless Chromium
(tests/e2e/browser.py): every image decoded, the failed video first with its error, each chart's axes titled with a
number at every tick, every link to an MP4 answering with the bytes the report lists, and the page's figures the
text report's."""

import hashlib
import io
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from rich.console import Console

from jobs.manifest import keys
from jobs.reports.text import print_report, summary_lines
from jobs.usecases import reports
from storage.stores import StoreUnavailable
from tests.e2e.browser import Browser

from .clocked import make_world, videos

CHARTS = """Array.from(document.querySelectorAll('svg.chart')).map(svg => ({
  name: svg.dataset.chart,
  y: Array.from(svg.querySelectorAll('text.tick.y')).map(t => t.textContent),
  x: Array.from(svg.querySelectorAll('text.tick.x')).map(t => t.textContent),
  titles: Array.from(svg.querySelectorAll('text.title')).map(t => t.textContent)}))"""


def test_the_html_report_of_a_run_in_a_real_browser(tmp_path, model_cache, registry, monkeypatch, chromium):
    w = make_world(tmp_path, f"sqlite:///{tmp_path / 'reelbatch.db'}", model_cache, registry, monkeypatch)
    real_store_for = keys.store_for

    class RefusingStore:  # never takes `broken`'s MP4: it fails after its attempts
        def __init__(self, store):
            self.store = store

        def put(self, key, *args, **kwargs):
            if key.endswith("/broken.mp4"):
                raise StoreUnavailable("the store refuses this one")
            return self.store.put(key, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.store, name)

    monkeypatch.setattr(keys, "store_for", lambda prefix: RefusingStore(real_store_for(prefix)))
    w.submit("paged", videos("ok", 2, steps=1) + [{"id": "broken", "prompt": "never stored", "steps": 1}])
    w.render_all()
    data = reports.report(w.settings, "paged")
    assert data["counts"]["succeeded"] == 2 and data["counts"]["failed"] == 1
    page, warnings = tmp_path / "report.html", []
    reports.write_html(w.settings, "paged", page, warn=warnings.append)
    assert warnings == [], "the failed video has no poster to look for"

    browser = Browser(chromium, tmp_path / "chromium")
    try:
        browser.open(page.as_uri())
        rendered = browser.until("document.body.dataset.rendered !== 'pending' && document.body.dataset.rendered",
                                 timeout=30)
        assert rendered == "ok:2" and browser.js("document.body.dataset.errors || ''") == ""
        sections = browser.js("Array.from(document.querySelectorAll('section[id]')).map(s => s.id)")
        assert sections == ["failed", "sheet"]
        failed = browser.js("document.querySelector('#failed figure').innerText")
        assert "broken" in failed and "the store refuses this one" in failed and "no MP4 stored" in failed
        charts = {c["name"]: c for c in browser.js(CHARTS)}
        assert list(charts) == ["throughput", "latency", "stages", "charges"]
        for c in charts.values():
            assert len(c["titles"]) == 2 and all(c["titles"]), c
            assert c["y"][0] == "0" and len(c["y"]) >= 2 and all(float(t) >= 0 for t in c["y"]), c
            assert c["x"], c
        assert charts["throughput"]["y"] == ["0", "1", "2"], "two videos stored"
        assert all(float(t) >= 0 for t in charts["throughput"]["x"])
        assert charts["stages"]["x"] == ["text", "denoise", "decode", "encode", "upload"]
        # The figures: the text report's lines, as the page shows them.
        shown = browser.js("document.getElementById('figures').innerText").splitlines()
        assert shown == summary_lines(data)
        text = io.StringIO()
        print_report(Console(file=text, width=300), data)
        assert all(line in text.getvalue().splitlines() for line in shown)
        # Every link: each stored video's MP4, from its poster, its caption and its row, and each one answers.
        links = browser.js("Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        stored = {v["id"]: v for v in data["videos"] if v["status"] == "succeeded"}
        expected = {(tmp_path / "out" / "paged" / f"{key}.mp4").resolve().as_uri(): v for key, v in stored.items()}
        assert sorted(links) == sorted(list(expected) * 3)
        for href, v in expected.items():
            answer = browser.send("Page.navigate", browser.session, url=href)
            assert "errorText" not in answer, (href, answer)
            body = Path(unquote(urlparse(href).path)).read_bytes()
            assert hashlib.sha256(body).hexdigest() == v["sha256"] and len(body) == v["bytes"]
    finally:
        browser.close()
    assert json.loads(json.dumps(data)) == reports.report(w.settings, "paged"), "the run's report unchanged"
