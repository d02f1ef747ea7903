"""What the server allows a team's request, whatever the manifest says: its runs write under the team's output root
only (jobs.usecases.teams: the server decides, never the client), and a run's name is one the API can always tell
from an id. A refusal is a 400 (jobs.usecases.submit.Refused) and comes before anything is written or recorded."""

from __future__ import annotations

from jobs.db.teams import TeamInfo
from jobs.manifest.outputs import canonical_output
from jobs.manifest.values import FieldError
from jobs.settings import Settings
from jobs.usecases.submit import Refused, check_served_name
from jobs.usecases.teams import output_root, team_settings


def checked(settings: Settings, team: TeamInfo, output: str | None, name: str | None) -> Settings:
    """The settings the team's request is read with (its root as the only allowed output and the default one),
    after its `?output=` and `?name=` are checked."""
    scoped = team_settings(settings, team)
    if output is not None:
        root = output_root(settings, team)
        try:
            canonical = canonical_output(output)
        except FieldError as exc:
            raise Refused(f"output: {exc}") from None
        if not canonical.startswith(root):
            read = "" if canonical == output else f" (read as {canonical})"
            raise Refused(f"output {output!r}{read} is not under your team's output root {root}")
    if name is not None:
        check_served_name(name, "name")
    return scoped
