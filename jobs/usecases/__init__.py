"""What reelbatch does, written once: the use cases both front doors call.

The command line (jobs.cli: typer and rich) and the HTTP API (jobs.service: FastAPI) stand side by side on this
floor and neither imports the other: each parses its input, calls one function here, and presents the typed result
(or the project's error) its own way. A use case takes the settings and plain arguments, acts for a team when it is
given one (another team's run is "not found", the same words as one that does not exist: jobs.db.teams.owned_run),
and says how it is going only through a `Feedback` (silent unless the caller shows it).

Modules: feedback (what a long use case reports as it goes), submit (a manifest checked and recorded, its work
queued), estimate (what it would cost, writing nothing), runs (status, cancel, resume, budget), reports (a run's
report, result files, HTML, capacity, the ledger), download (a run's files fetched, checksums checked), teams
(teams and tokens), schedules, notifications, models (every model a manifest may name, with its gate states).
"""
