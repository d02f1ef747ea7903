import pytest

from engine.models.registry import Registry
from jobs.db.connect import session_factory, upgrade


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh, migrated database: the SQLite default and a real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'reelbatch.db'}"
    url = request.getfixturevalue("postgres_url")
    upgrade(url)
    return url


@pytest.fixture
def factory(db_url):
    return session_factory(db_url)


@pytest.fixture
def registry():
    return Registry()
