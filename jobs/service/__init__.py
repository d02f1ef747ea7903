"""The HTTP API teams share (`reelbatch serve`): FastAPI on uvicorn. Every route acts for the team its bearer token
names, on that team's runs only, through the use cases the CLI calls too (jobs.usecases): the API does
nothing the CLI cannot. app (assembly, errors as HTTP statuses), auth (the token), guards (body size, submission rate),
one module of routes per noun (submit, runs, videos) and the live page."""

from jobs.service.app import ServiceConfig, create_app

__all__ = ["ServiceConfig", "create_app"]
