"""The live page's HTML (jobs.service.page): one file, no library, nothing fetched but the API itself.

It polls (every POLL_MS) rather than holding a server-sent event stream open: each poll is the same authenticated
GET a script would make, a proxy needs no streaming setup, and a page left open costs the server one request per
interval rather than one held connection. The token is typed in once and kept in the tab's sessionStorage (gone
when the tab closes); every request sends it in the Authorization header, posters included (fetched as blobs), so it
never appears in a URL or a log.

A run's report is read again when its counts have moved, else every REREAD_MS: a finished run costs little more
than its status.

Each run: a progress bar (videos done of total), counts by state, its rate (videos an hour so far), cost so far,
and when it should finish: the estimate's projected finish (`status`), else the rate so far carried forward. Each
failed or flagged (needs review) video: its poster (a failed one has none) and its error.
"""

POLL_MS = 2000
REREAD_MS = 20000

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>reelbatch</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin: 0 0 .3em; }
.run { border: 1px solid #ccc; border-radius: 6px; padding: .8em; margin: .8em 0; }
.bar { background: #eee; height: 12px; border-radius: 6px; overflow: hidden; }
.bar > div { background: #3a7; height: 100%; }
.facts { color: #555; margin: .4em 0; }
.video { display: flex; gap: .8em; align-items: flex-start; margin: .4em 0; }
.video img { width: 96px; border: 1px solid #ccc; }
.err { color: #a22; white-space: pre-wrap; } .flag { color: #a60; }
#who { color: #555; } #problem { color: #a22; }
</style></head>
<body>
<h1>reelbatch runs</h1>
<form id="login"><input id="token" type="password" placeholder="API token" size="50" autocomplete="off">
<button type="submit">Show my runs</button></form>
<p id="who"></p><p id="problem"></p>
<div id="runs"></div>
<script>
"use strict";
const POLL_MS = __POLL_MS__, REREAD_MS = __REREAD_MS__;
const posters = new Map();  // "run/video" -> object URL, fetched once
const reports = new Map();  // run name -> {key: its counts when read, report}
function token() { return sessionStorage.getItem("reelbatch-token"); }
async function api(path) {
  const r = await fetch(path, {headers: {"Authorization": "Bearer " + token()}});
  if (!r.ok) { const e = new Error(r.status + " " + (await r.text())); e.status = r.status; throw e; }
  return r;
}
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}
function money(x) { return x == null ? "unknown" : "$" + x.toFixed(4); }
function when(iso) { return iso ? new Date(iso).toISOString().slice(0, 19).replace("T", " ") + "Z" : ""; }
async function poster(run, id, img) {
  const key = run + "/" + id;
  if (!posters.has(key)) {
    try { posters.set(key, URL.createObjectURL(await (await api(
      "/v1/runs/" + encodeURIComponent(run) + "/videos/" + encodeURIComponent(id) + "/poster.jpg")).blob())); }
    catch (e) { posters.set(key, null); }
  }
  if (posters.get(key)) img.src = posters.get(key);
}
function card(status, report) {
  const c = status.counts, done = c.succeeded + c.failed + c.cancelled, total = status.total;
  const pct = total ? Math.round(100 * done / total) : 0;
  const rate = report.throughput && report.throughput.videos_per_hour;
  let eta = status.projected_finish ? when(status.projected_finish) + " (estimate)" : "";
  if (!eta && done < total && rate) {
    eta = when(new Date(Date.now() + (total - done) / rate * 3600e3).toISOString()) + " (at the rate so far)";
  }
  const box = el("div", {class: "run", "data-run": status.name});
  box.append(el("h2", {}, status.name + " (" + status.model + ")"));
  const bar = el("div", {class: "bar"}, el("div", {style: "width:" + pct + "%"}));
  box.append(bar, el("div", {class: "facts progress"}, done + " of " + total + " done (" + pct + "%): " +
    c.succeeded + " succeeded, " + c.running + " running, " + c.pending + " pending, " + c.failed +
    " failed, " + c.cancelled + " cancelled"));
  box.append(el("div", {class: "facts"}, "rate " + (rate ? rate.toFixed(1) + " videos/hour" : "not yet") +
    "; cost so far " + money(report.cost && report.cost.total_usd) + (eta ? "; finishes " + eta : "")));
  for (const v of report.videos || []) {
    if (v.status !== "failed" && !v.needs_review) continue;
    const img = el("img", {alt: "poster of " + v.id});
    const what = v.status === "failed" ? el("div", {class: "err"}, "failed: " + (v.error || ""))
                                       : el("div", {class: "flag"}, "flagged for review" +
                                                (v.seam_score != null ? " (seam score " + v.seam_score + ")" : ""));
    box.append(el("div", {class: "video", "data-video": v.id}, img, el("div", {}, el("b", {}, v.id), what)));
    if (v.poster_uri) poster(status.name, v.id, img);
  }
  return box;
}
async function poll() {
  if (!token()) return;
  try {
    const runs = (await (await api("/v1/runs")).json()).runs.slice(-20).reverse();
    const cards = [];
    for (const r of runs) {
      // A report is read again when the run's counts moved, else every REREAD_MS (a video flagged later).
      const key = r.name + JSON.stringify(r.counts) + r.budget_reached + r.charged_usd;
      const held = reports.get(r.name);
      if (!held || held.key !== key || Date.now() - held.at > REREAD_MS) {
        reports.set(r.name, {key, at: Date.now(), report: await (await api("/v1/runs/" + encodeURIComponent(r.name) +
                                                           "/report")).json()});
      }
      cards.push(card(r, reports.get(r.name).report));
    }
    document.getElementById("runs").replaceChildren(...cards);
    document.getElementById("who").textContent = runs.length + " runs; updated " + when(new Date().toISOString());
    document.getElementById("problem").textContent = "";
  } catch (e) {
    document.getElementById("problem").textContent = e.status === 401 ? "unknown or revoked token" : String(e);
  }
}
document.getElementById("login").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem("reelbatch-token", document.getElementById("token").value.trim());
  document.getElementById("token").value = "";
  poll();
});
poll();
setInterval(poll, POLL_MS);
</script></body></html>
""".replace("__POLL_MS__", str(POLL_MS)).replace("__REREAD_MS__", str(REREAD_MS))
