"""What a run did and cost: its report (the same data for the text, `--json`, the HTML file and the API), its result
files, what N GPUs could do from it (capacity), and where every worker second went (the ledger). What `reelbatch
report|capacity|ledger` and the API's report and result routes answer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jobs.cost import ledger as cost_ledger
from jobs.db import queries
from jobs.db.connect import is_postgres
from jobs.db.rows import Run
from jobs.db.teams import TeamInfo, owned_run
from jobs.errors import ReelbatchError, UsageError
from jobs.manifest.keys import object_key, poster_key
from jobs.reports import postgres
from jobs.reports.capacity import plan
from jobs.reports.html import html_report
from jobs.reports.results import result_files, write_results
from jobs.reports.summary import entry, report_dict, report_of
from jobs.settings import Settings
from jobs.usecases.database import read_factory, snapshot_factory
from storage.local import LocalStore
from storage.poster import poster_jpeg
from storage.stores import StoreError, open_store

# How long the HTML report's links to MP4s in S3 stay valid: 7 days, the longest a SigV4 presigned URL may be.
PRESIGN_S = 7 * 24 * 3600


def _run_name(factory, run: str, team: TeamInfo | None) -> str:
    return run if team is None else owned_run(factory, team, run).name


def in_sql(settings: Settings) -> bool:
    """Whether PostgreSQL counts and writes the report itself (jobs.reports.postgres)."""
    return settings.reports.sql and is_postgres(settings.database_url)


def report(settings: Settings, run: str, team: TeamInfo | None = None, listed: int | None = None) -> dict:
    """`report --json`'s data from every row, as on SQLite (the same JSON PostgreSQL's counting writes). `listed`:
    only the first `listed` videos (and any with an error) get an entry."""
    factory = snapshot_factory(settings)
    run_row, videos = queries.load_report(factory, _run_name(factory, run, team))
    return report_dict(run_row, videos, settings.prices.sale, cost_ledger.run_ledger(factory, run_row.id),
                       listed=listed)


@dataclass(frozen=True)
class VideoPage:
    """A page of a run's videos (their report entries, in the order submitted) and the `after` of the next page
    (None: this was the last)."""

    videos: list[dict]
    next: int | None


def video_page(settings: Settings, run: str, team: TeamInfo | None = None, states: tuple[str, ...] = (),
               flagged: bool | None = None, after: int = 0, limit: int = 100) -> VideoPage:
    """Up to `limit` of a run's videos after row id `after`: those in `states` (all when empty), flagged by their
    checks or marked for review when `flagged` is true (neither when false). What the API's video list and the live
    page read instead of a whole report."""
    factory = snapshot_factory(settings)
    rows = queries.video_page(factory, _run_name(factory, run, team), states, flagged, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return VideoPage([{**entry(v, micro), "row": v.id} for v, micro in rows], rows[-1][0].id if more else None)


@dataclass(frozen=True)
class SqlReport:
    """A report counted by PostgreSQL in one snapshot: the data, and `--json`'s entries as chunks of JSON text."""

    data: dict
    entries: list[str]


def report_in_sql(settings: Settings, run: str, with_entries: bool, listed: int) -> SqlReport:
    """The report counted by PostgreSQL: one snapshot for the charges, the figures and the entries, so a run that
    workers are still recording adds up. The entries are read to the end here, so a reader that stops reading
    (`| less`) never holds the transaction open past the server's idle-in-transaction timeout."""
    factory = read_factory(settings)
    run_row = queries.find_run(factory, run)
    with factory() as s:
        s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        if with_entries and settings.reports.parallel:  # the entries on a second connection meanwhile
            with postgres.entries_beside(factory, s, run_row) as later:
                data = _figures_in_sql(factory, s, run_row, settings, with_entries, listed)
                # Done: end this transaction rather than leave it idle while the entries come; the second
                # connection took its snapshot already and keeps it.
                s.rollback()
                entries = later.result()
        else:
            data = _figures_in_sql(factory, s, run_row, settings, with_entries, listed)
            entries = list(postgres.entries(s, run_row)) if with_entries else []
    return SqlReport(data, list(entries))


def _figures_in_sql(factory, s, run_row: Run, settings: Settings, with_entries: bool, listed: int) -> dict:
    """The report but `--json`'s entries, counted by PostgreSQL in `s`'s transaction."""
    charges = postgres.charges(s, run_row)
    figures = postgres.figures(s, run_row, sum(micro for _, micro, _ in charges.by_kind))
    costs = cost_ledger.run_ledger(factory, run_row.id, charges)
    rows = [] if with_entries else [entry(v, micro) for v, micro in postgres.listed_rows(s, run_row, listed)]
    return report_of(run_row, figures, rows, settings.prices.sale, costs)


def write_result_files(settings: Settings, run: str) -> list[str]:
    """results.jsonl and errors.jsonl written beside the run's videos; their URIs."""
    try:
        return write_results(read_factory(settings), run)
    except StoreError as exc:
        raise ReelbatchError(f"writing the result files of run {run}: {exc}") from None


def result_file(settings: Settings, run: str, which: str, team: TeamInfo | None = None) -> bytes:
    """The run's `results` or `errors` file as it would be written now (JSON lines)."""
    factory = snapshot_factory(settings)
    row, videos = queries.load_report(factory, _run_name(factory, run, team))
    results, errors = result_files(row, videos)
    return {"results": results, "errors": errors}[which]


def write_html(settings: Settings, run: str, path: Path, warn: Callable[[str], None]) -> dict:
    """The self-contained HTML report (contact sheet, charts, the table) written to `path`; `warn` hears of a video
    left out of the contact sheet. Returns the report's data, so the caller can print the same figures."""
    factory = snapshot_factory(settings)
    run_row, videos = queries.load_report(factory, run)
    costs = cost_ledger.run_ledger(factory, run_row.id)
    data = report_dict(run_row, videos, settings.prices.sale, costs)
    store = open_store(run_row.output)

    def poster_of(video):
        try:
            if video.poster_uri:
                return store.get(poster_key(run_row.name, video.key))
            if not video.uri:
                return None  # nothing stored (a failed video): shown without a poster
            # A video stored before posters existed (or whose poster could not be stored): made from its MP4.
            return poster_jpeg(store.get(object_key(run_row.name, video.key)))
        except (StoreError, ValueError) as exc:
            warn(f"{video.key}: shown without its poster: {exc}")
            return None

    def link_of(video):
        if not video.uri:
            return None
        key = object_key(run_row.name, video.key)
        if isinstance(store, LocalStore):
            return store.path(key).resolve().as_uri()  # absolute and percent-encoded, as a browser opens it
        try:  # S3: a link that opens without credentials for as long as SigV4 allows
            return store.presigned_get(key, PRESIGN_S)
        except StoreError as exc:
            warn(f"{video.key}: no link to its MP4: {exc}")
            return None

    try:
        page = html_report(data, run_row, videos, poster_of, costs["usd_per_charged_s"], link_of)
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--html: cannot write {path}: {exc.strerror}") from None
    return data


def capacity(settings: Settings, run: str, gpus: int, run_gpus: int, headroom: float) -> dict:
    """Videos per day and month, cost per video and margin for N GPUs at three levels, from what `run` measured."""
    factory = snapshot_factory(settings)
    run_row, videos = queries.load_report(factory, run)
    try:
        return plan(run_row, videos, gpus=gpus, run_gpus=run_gpus, gpu_hour_usd=settings.prices.gpu.usd_per_hour,
                    gpu_hour_source=settings.prices.gpu.source, price=settings.prices.sale, headroom=headroom,
                    session_utilisation=cost_ledger.run_ledger(factory, run_row.id)["utilisation"])
    except ValueError as exc:
        raise UsageError(f"--run {run}: {exc}") from None


def ledger(settings: Settings) -> dict:
    """Every worker session's up time at its rate, split into what was charged to videos and what was idle."""
    rows = cost_ledger.sessions(snapshot_factory(settings))
    return {
        "sessions": [dataclasses.asdict(r) for r in rows],
        "total_usd": sum(r.total_micro_usd for r in rows) / 1e6,
        "charged_usd": sum(r.charged_micro_usd for r in rows) / 1e6,
        "idle_usd": sum(r.idle_micro_usd for r in rows) / 1e6,
    }
