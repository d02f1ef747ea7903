"""Workers that start together on the embedded SQLite broker: each declares the queues it consumes, and none dies on
the queue's row another made a moment before (kombu's transport guards that insert with one process's lock only; CI
saw a worker's consumer die on `UNIQUE constraint failed: kombu_queue.name`). Real processes, a real broker file."""

import multiprocessing
import sqlite3

from jobs.settings import Settings
from jobs.work.app import create_app, declare_queues

QUEUES = [f"render.model.m{i}" for i in range(12)] + ["render", "render.control"]
PROCESSES = 6


def declare(broker_url, start, errors):
    settings = Settings.from_env().with_values({"broker_url": broker_url})
    app = create_app(settings)
    with app.connection_for_write() as conn:
        conn.default_channel  # connected (the broker's tables made) before the start, so all insert at once
    start.wait()
    try:
        declare_queues(app, QUEUES)
    except Exception as exc:  # reported to the test, which names it
        errors.put(f"{type(exc).__name__}: {exc}".splitlines()[0])


def test_workers_that_start_together_each_declare_their_queues_once(tmp_path):
    broker = tmp_path / "broker.db"
    url = f"sqla+sqlite:///{broker}"
    context = multiprocessing.get_context("fork")
    declare(url, context.Barrier(1), context.Queue())  # the broker's tables, as a first worker makes them
    with sqlite3.connect(broker) as db:
        db.execute("DELETE FROM kombu_queue")  # the tables stay; every queue is new to the racers below
    start, errors = context.Barrier(PROCESSES), context.Queue()
    racers = [context.Process(target=declare, args=(url, start, errors)) for _ in range(PROCESSES)]
    for p in racers:
        p.start()
    for p in racers:
        p.join(120)
    said = []
    while not errors.empty():
        said.append(errors.get())
    assert said == []
    assert [p.exitcode for p in racers] == [0] * PROCESSES
    with sqlite3.connect(broker) as db:
        rows = db.execute("SELECT name, COUNT(*) FROM kombu_queue GROUP BY name ORDER BY name").fetchall()
    assert rows == sorted((name, 1) for name in QUEUES)
