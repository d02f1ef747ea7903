from jobs.cli import app

app(prog_name="reelbatch")
