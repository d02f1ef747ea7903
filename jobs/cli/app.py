"""The `reelbatch` command line, assembled: one Typer command or sub-app per noun (each in its own module here),
errors to stderr with exit 2 for bad input, `--json` for scripts. Commands that render or queue import torch and
Celery inside their bodies, so `--help`, `status`, `report` and the like start without them."""

from __future__ import annotations

import typer

from jobs.cli.bench import bench_app
from jobs.cli.db import db_app
from jobs.cli.download import download
from jobs.cli.models import models_cmd
from jobs.cli.notifications import notifications_cmd
from jobs.cli.plan import budget, estimate
from jobs.cli.prune import prune
from jobs.cli.quality import quality
from jobs.cli.reports import capacity, ledger_cmd, report
from jobs.cli.runs import cancel, resume, status
from jobs.cli.scale import scale
from jobs.cli.schedule import beat, schedule_app
from jobs.cli.settings import settings_cmd
from jobs.cli.submit import run, submit
from jobs.cli.teams import team_app, token_app
from jobs.cli.toy import toy_app
from jobs.cli.worker import worker

app = typer.Typer(help="Batch-render text-to-video manifests to verified MP4s with cost records.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)

# In the order `--help` lists them: the life of a run, then operations, then measuring.
app.command()(run)
app.command()(submit)
app.command()(estimate)
app.command()(worker)
app.command()(status)
app.command()(report)
app.command()(cancel)
app.command()(resume)
app.command()(download)
app.command("notifications")(notifications_cmd)
app.add_typer(team_app, name="team")
app.add_typer(token_app, name="token")
app.command()(budget)
app.command()(capacity)
app.command()(scale)
app.command("ledger")(ledger_cmd)
app.command()(prune)
app.add_typer(schedule_app, name="schedule")
app.command()(beat)
app.add_typer(db_app, name="db")
app.command("settings")(settings_cmd)
app.command("models")(models_cmd)
app.command()(quality)
app.add_typer(bench_app, name="bench")
app.add_typer(toy_app, name="toy")
