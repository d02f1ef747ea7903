from jobs.main import app

app(prog_name="reelbatch")
