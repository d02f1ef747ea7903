"""The live page's HTML (jobs.service.page): one file, no library, nothing fetched but the API itself.

It polls rather than holding a server-sent event stream open: each poll is the same authenticated GET a script would
make, a proxy needs no streaming setup, and a page left open costs the server a few requests per interval rather than
one held connection. A poll starts POLL_MS after the last one ended, never beside it. The token is typed in once and
kept in the tab's sessionStorage (gone when the tab closes); every request sends it in the Authorization header,
posters and MP4s included (fetched as blobs), so it never appears in a URL or a log.

It reads only what it shows: the team's runs (`GET /v1/runs`), and for each run the videos that need attention
(failed, then flagged by their checks or marked for review: `GET /v1/runs/RUN/videos`, a page of 50 at a time with
"show more") and, when its list is opened, one page of all its videos (each with its poster and a link to its MP4).
These are read again when the run's counts moved, else every REREAD_MS (a video flagged later). The run's rate and
cost so far come from its report with no entries (`?entries=0`), read beside the poll, never holding it up, so a
100,000-video run draws from its status and a page of videos.

Each run: a bar with a part per state (succeeded green, running blue, failed red, cancelled grey), its state in words
(running, succeeded, cancelled, ended with failures), counts by state, its rate (videos an hour so far), cost so far,
and when it should finish: the estimate's projected finish (`status`), else the rate so far carried forward. A video
without a poster shows a "no poster" box, never a broken image.
"""

POLL_MS = 2000
REREAD_MS = 20000
PAGE_SIZE = 50

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>reelbatch</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin: 0 0 .3em; }
.run { border: 1px solid #ccc; border-radius: 6px; padding: .8em; margin: .8em 0; }
.bar { background: #eee; height: 12px; border-radius: 6px; overflow: hidden; display: flex; }
.bar > div { height: 100%; }
.bar .succeeded { background: #3a7; } .bar .running { background: #38c; } .bar .failed { background: #c33; }
.bar .cancelled { background: #999; }
.state { font-weight: normal; font-size: .9em; padding: 0 .4em; border-radius: 4px; margin-left: .4em; }
.state.succeeded { background: #dfd; } .state.running, .state.waiting { background: #def; }
.state.cancelled { background: #eee; } .state.failed { background: #fdd; }
.facts { color: #555; margin: .4em 0; }
.video { display: flex; gap: .8em; align-items: flex-start; margin: .4em 0; }
.video img, .noposter { width: 96px; border: 1px solid #ccc; }
.noposter { height: 54px; color: #888; font-size: .8em; display: flex; align-items: center; justify-content: center; }
.video .st { font-size: .85em; padding: 0 .3em; border-radius: 3px; }
.st.succeeded { background: #dfd; } .st.failed { background: #fdd; } .st.cancelled { background: #eee; }
.st.running, .st.pending { background: #def; }
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
const POLL_MS = __POLL_MS__, REREAD_MS = __REREAD_MS__, PAGE_SIZE = __PAGE_SIZE__;
const posters = new Map();  // "run/video" -> object URL (null: none), fetched once
const views = new Map();    // run name -> what the page holds of it (below)
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
function runPath(run) { return "/v1/runs/" + encodeURIComponent(run); }
function money(x) { return x == null ? "not yet" : "$" + x.toFixed(4); }
function when(iso) { return iso ? new Date(iso).toISOString().slice(0, 19).replace("T", " ") + "Z" : ""; }
async function videos(run, query, after) {  // one page of a run's videos
  return (await api(runPath(run) + "/videos?limit=" + PAGE_SIZE + "&after=" + (after || 0) +
                    (query ? "&" + query : ""))).json();
}
async function mp4(run, id) {  // the MP4 as a blob: the token goes in the header, never in a link
  return (await api(runPath(run) + "/videos/" + encodeURIComponent(id) + ".mp4")).blob();
}
async function download(run, id) {
  const a = el("a", {href: URL.createObjectURL(await mp4(run, id)), download: id + ".mp4"});
  document.body.append(a); a.click(); a.remove();
}
async function poster(run, id, img) {
  const key = run + "/" + id;
  if (!posters.has(key)) {
    try { posters.set(key, URL.createObjectURL(await (await api(
      runPath(run) + "/videos/" + encodeURIComponent(id) + "/poster.jpg")).blob())); }
    catch (e) { posters.set(key, null); }
  }
  if (posters.get(key)) { img.src = posters.get(key); img.hidden = false; img.nextSibling.remove(); }
  else img.nextSibling.textContent = "no poster";
}
function runState(c, total) {
  if (c.pending + c.running > 0) return c.running || c.succeeded + c.failed + c.cancelled ? "running" : "waiting";
  if (total && c.cancelled === total) return "cancelled";
  if (c.failed + c.cancelled === 0) return "succeeded";
  return "failed";
}
const STATE_WORDS = {running: "running", waiting: "waiting for a worker", cancelled: "cancelled",
                     succeeded: "succeeded", failed: "ended with failures"};
function videoRow(run, v) {
  const img = el("img", {alt: "poster of " + v.id, hidden: ""});
  const box = el("div", {class: "noposter"}, v.poster_uri ? "loading" : "no poster");
  const about = el("div", {}, el("b", {}, v.id), " ", el("span", {class: "st " + v.status}, v.status));
  if (v.status === "failed") about.append(el("div", {class: "err"}, "failed: " + (v.error || "")));
  if (v.flagged || v.needs_review) {
    // As the text report says them: "frozen 0.889 > 0.5" (motion has a floor, the others a ceiling).
    const failed = Object.entries(v.checks || {}).filter(([k, c]) => c && c.passed === false)
      .map(([k, c]) => k + " " + Number(c.value.toPrecision(3)) + (k === "motion" ? " < " : " > ") + c.limit);
    about.append(el("div", {class: "flag"}, "flagged for review" +
      (failed.length ? " (" + failed.join("; ") + ")" : "") +
      (v.needs_review && v.seam_score != null ? " (seam score " + v.seam_score + ")" : "")));
  }
  if (v.status === "cancelled" && v.cancel_reason) about.append(el("div", {}, "cancelled: " + v.cancel_reason));
  if (v.uri) {
    const link = el("a", {href: "#", class: "mp4"}, "MP4");
    link.addEventListener("click", ev => { ev.preventDefault(); download(run, v.id); });
    about.append(" ", link);
  }
  const row = el("div", {class: "video", "data-video": v.id, "data-status": v.status}, img, box, about);
  if (v.poster_uri) poster(run, v.id, img);
  return row;
}
async function readVideos(name, view) {  // what needs attention, and the open page of all videos
  const failed = await videos(name, "status=failed", 0), flagged = await videos(name, "flagged=true", 0);
  view.failed = failed; view.flagged = flagged;
  if (view.open) view.page = await videos(name, "", view.after[view.after.length - 1]);
}
async function more(name, which) {
  const view = views.get(name), held = view[which];
  const next = await videos(name, which === "failed" ? "status=failed" : "flagged=true", held.next);
  view[which] = {videos: held.videos.concat(next.videos), next: next.next};
  draw();
}
function readSummary(name, view) {  // rate and cost: the report without entries, beside the poll
  if (view.summaryBusy) return;
  view.summaryBusy = true;
  api(runPath(name) + "/report?entries=0").then(r => r.json())
    .then(report => { view.summary = report; view.summaryKey = view.key; draw(); })
    .catch(() => {}).finally(() => { view.summaryBusy = false; });
}
function card(status) {
  const view = views.get(status.name), c = status.counts, total = status.total;
  const done = c.succeeded + c.failed + c.cancelled, pct = total ? Math.round(100 * done / total) : 0;
  const state = runState(c, total), report = view.summary || {};
  const rate = report.throughput && report.throughput.videos_per_hour;
  let eta = status.projected_finish ? when(status.projected_finish) + " (estimate)" : "";
  if (!eta && done < total && rate) {
    eta = when(new Date(Date.now() + (total - done) / rate * 3600e3).toISOString()) + " (at the rate so far)";
  }
  const box = el("div", {class: "run", "data-run": status.name, "data-state": state});
  box.append(el("h2", {}, status.name + " (" + status.model + ")",
                el("span", {class: "state " + state}, STATE_WORDS[state])));
  const bar = el("div", {class: "bar"});
  for (const k of ["succeeded", "running", "failed", "cancelled"]) {
    if (c[k]) bar.append(el("div", {class: k, style: "width:" + (100 * c[k] / total) + "%", title: c[k] + " " + k}));
  }
  box.append(bar, el("div", {class: "facts progress"}, done + " of " + total + " done (" + pct + "%): " +
    c.succeeded + " succeeded, " + c.running + " running, " + c.pending + " pending, " + c.failed +
    " failed, " + c.cancelled + " cancelled" + (status.flagged ? ", " + status.flagged + " flagged" : "")));
  box.append(el("div", {class: "facts"}, "rate " + (rate ? rate.toFixed(1) + " videos/hour" : "not yet") +
    "; cost so far " + money(report.cost && report.cost.total_usd) + (eta ? "; finishes " + eta : "")));
  const shown = new Set();
  for (const which of ["failed", "flagged"]) {
    const held = view[which];
    if (!held) continue;
    for (const v of held.videos) if (!shown.has(v.id)) { shown.add(v.id); box.append(videoRow(status.name, v)); }
    if (held.next != null) {
      const b = el("button", {class: "more-" + which}, "show more " + which + " videos");
      b.addEventListener("click", () => more(status.name, which));
      box.append(b);
    }
  }
  const list = el("details", {class: "all"}, el("summary", {}, "all " + total + " videos"));
  if (view.open) list.setAttribute("open", "");
  list.addEventListener("toggle", () => {
    if (list.open === view.open) return;
    view.open = list.open; view.at = 0;
    if (view.open) poll();
  });
  if (view.open && view.page) {
    for (const v of view.page.videos) list.append(videoRow(status.name, v));
    if (view.after.length > 1) {
      const b = el("button", {class: "prev"}, "previous " + PAGE_SIZE);
      b.addEventListener("click", () => { view.after.pop(); view.at = 0; poll(); });
      list.append(b);
    }
    if (view.page.next != null) {
      const b = el("button", {class: "next"}, "next " + PAGE_SIZE);
      b.addEventListener("click", () => { view.after.push(view.page.next); view.at = 0; poll(); });
      list.append(b);
    }
  }
  box.append(list);
  return box;
}
let shownRuns = [], polling = false;
function draw() { document.getElementById("runs").replaceChildren(...shownRuns.map(card)); }
async function poll() {
  if (!token() || polling) return;
  polling = true;
  try {
    const runs = (await (await api("/v1/runs?limit=20")).json()).runs.reverse();
    for (const r of runs) {
      if (!views.has(r.name)) views.set(r.name, {after: [0], open: false, at: 0});
      const view = views.get(r.name);
      // Videos are read again when the run's counts moved, else every REREAD_MS (a video flagged later).
      const key = JSON.stringify([r.counts, r.flagged, r.budget_reached, r.charged_usd]);
      if (view.key !== key || Date.now() - view.at > REREAD_MS) {
        await readVideos(r.name, view);
        view.key = key; view.at = Date.now();
      }
      if (view.summaryKey !== view.key) readSummary(r.name, view);
    }
    shownRuns = runs;
    draw();
    document.getElementById("who").textContent = runs.length + " runs; updated " + when(new Date().toISOString());
    document.getElementById("problem").textContent = "";
  } catch (e) {
    document.getElementById("problem").textContent = e.status === 401 ? "unknown or revoked token" : String(e);
  } finally {
    polling = false;
  }
}
async function loop() { await poll(); setTimeout(loop, POLL_MS); }  // the next poll starts after this one ends
document.getElementById("login").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem("reelbatch-token", document.getElementById("token").value.trim());
  document.getElementById("token").value = "";
  poll();
});
loop();
</script></body></html>
""".replace("__POLL_MS__", str(POLL_MS)).replace("__REREAD_MS__", str(REREAD_MS)).replace(
    "__PAGE_SIZE__", str(PAGE_SIZE))
