"""A worker's shutdown state (jobs.render.stopping): its phases, the time it says the batch in hand needs, the grace
decision, and the phase shared with a forked child. Controlled clock; every expected number worked out by hand."""

import os
import time

from jobs.render.stopping import InHand, Phase, Stopping, read_steps, steps_file, write_steps


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def steps_at(stopping: Stopping, clock: Clock, progress, *times: float) -> None:
    for t in times:
        clock.now = t
        progress.step(t)


def test_the_phase_moves_one_way():
    stopping = Stopping(Clock())
    assert stopping.phase is Phase.WORKING and stopping.taking_work()
    stopping.finish(grace_s=30)
    assert stopping.phase is Phase.FINISHING and not stopping.taking_work() and stopping.deadline == 130.0
    stopping.finish(grace_s=5)  # a second first signal changes nothing: the grace counts from the first
    assert stopping.deadline == 130.0
    stopping.stop_now()
    assert stopping.phase is Phase.STOPPING and not stopping.taking_work()
    stopping.finish()
    assert stopping.phase is Phase.STOPPING, "never back"


def test_no_grace_means_the_batch_always_finishes():
    clock = Clock()
    stopping = Stopping(clock)
    stopping.finish()
    progress = stopping.begin(videos=2, steps=1000)
    steps_at(stopping, clock, progress, 110.0, 120.0)  # 10 s a step, 998 left
    assert stopping.deadline == float("inf") and stopping.covers(progress, 120.0)


def test_what_the_batch_in_hand_needs_is_measured_from_its_steps_then_the_last_batch():
    clock = Clock(100.0)
    stopping = Stopping(clock)
    assert stopping.describe() == InHand() and InHand().text() == "no batch in hand"

    first = stopping.begin(videos=4, steps=10)
    assert stopping.describe().text() == "the batch in hand (4 videos, not at its first step yet), its time is " \
                                         "not measured yet"
    steps_at(stopping, clock, first, 130.0)  # the first step carries the model's loading: no rate yet
    assert stopping.describe() == InHand(4, 1, 10, None, "rendering", tail_known=False)
    steps_at(stopping, clock, first, 132.0, 134.0, 136.0)
    clock.now = 137.0
    # 2 s a step (130 -> 136 over 3 steps), 6 steps left, 1 s of the next already spent; no batch stored yet, so
    # what follows the steps is not known.
    assert stopping.describe() == InHand(4, 4, 10, 11.0, "rendering", tail_known=False)
    assert stopping.describe().text() == ("the batch in hand (4 videos, step 4 of 10), about 11 s of steps, then its "
                                          "decode and store")
    assert stopping.describe().text(estimate=False) == "the batch in hand (4 videos, step 4 of 10)"

    steps_at(stopping, clock, first, 138.0, 140.0, 142.0, 144.0, 146.0, 148.0)
    stopping.rendered(first)
    clock.now = 150.0
    assert stopping.describe().stage == "storing"
    assert stopping.describe().text() == "the batch in hand (4 videos, storing), its time is not measured yet"
    clock.now = 153.0
    stopping.recorded(first)  # 5 s from its last step to its record: decode, encode, upload
    assert stopping.tail_s == 5.0 and stopping.in_hand is None

    second = stopping.begin(videos=1, steps=10)
    steps_at(stopping, clock, second, 170.0, 173.0)
    # 3 s a step, 8 steps left, then the 5 s that followed the first batch's steps.
    assert stopping.left_s(second, 173.0) == 29.0
    assert stopping.describe().text() == "the batch in hand (1 video, step 2 of 10), about 29 s"


def test_from_its_first_step_after_the_model_is_loaded_the_batch_in_hand_has_a_time():
    """A Ctrl-C at the first step of a run's first batch: the model took 40 s to load, the first step 3 s after it
    (its prompts and the step); the message says 9 steps at 3 s. The grace decision still waits for a second step."""
    clock = Clock(100.0)
    stopping = Stopping(clock)
    progress = stopping.begin(videos=2, steps=10)
    clock.now = 140.0
    stopping.loaded(progress)
    steps_at(stopping, clock, progress, 143.0)
    clock.now = 144.0
    # 3 s a step (140 -> 143), 9 steps left: 27 s, 1 s of them spent.
    assert stopping.describe() == InHand(2, 1, 10, 26.0, "rendering", tail_known=False)
    assert stopping.describe().text() == ("the batch in hand (2 videos, step 1 of 10), about 26 s of steps, then its "
                                          "decode and store")
    assert stopping.left_s(progress, 144.0) is None, "the grace's measure: between steps"


def test_a_grace_that_cannot_cover_the_rest_stops_the_batch():
    clock = Clock(100.0)
    short, long = Stopping(clock), Stopping(clock)
    progress = short.begin(videos=2, steps=20)
    steps_at(short, clock, progress, 110.0, 112.0, 114.0)  # 2 s a step, 17 left: done at 148
    short.finish(grace_s=30)  # until 144
    long.finish(grace_s=40)  # until 154
    assert not short.covers(progress, 114.0) and long.covers(progress, 114.0)
    assert long.covers(progress, 120.0), "counted from the last step: still done at 148"
    steps_at(short, clock, progress, 124.0)  # a slow step: (124 - 110) / 3 s a step, 16 left: done at 198.7
    assert not long.covers(progress, 124.0)


def test_an_unmeasured_batch_is_not_stopped_for_its_grace_until_it_is_measured():
    clock = Clock(100.0)
    stopping = Stopping(clock)
    stopping.finish(grace_s=0)
    progress = stopping.begin(videos=1, steps=50)
    steps_at(stopping, clock, progress, 160.0)
    assert stopping.covers(progress, 160.0), "one step measures nothing"
    steps_at(stopping, clock, progress, 161.0)
    assert not stopping.covers(progress, 161.0)


def test_a_forked_child_sees_the_phase_its_parent_sets_later():
    """A prefork worker's children share the phase: the parent's signal handler writes it after they forked."""
    stopping = Stopping()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait (at most 10 s) for the parent's stop, report what it saw
        os.close(read)
        deadline = time.monotonic() + 10
        while stopping.phase is Phase.WORKING and time.monotonic() < deadline:
            time.sleep(0.01)
        os.write(write, bytes([int(stopping.phase)]) + repr(stopping.deadline).encode())
        os._exit(0)
    os.close(write)
    try:
        time.sleep(0.1)
        stopping.finish(grace_s=90)
        expected = stopping.deadline
        seen = b""
        while chunk := os.read(read, 100):
            seen += chunk
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert seen[0] == Phase.FINISHING and float(seen[1:]) == expected


def test_the_steps_file_run_reads_says_how_many_videos_worth_are_done(tmp_path):
    path = steps_file(tmp_path / "w.notices")
    assert path == tmp_path / "w.steps" and read_steps(path) == 0.0
    stopping = Stopping(Clock())
    progress = stopping.begin(videos=2, steps=8)
    for _ in range(3):
        progress.step(100.0)
    write_steps(path, progress)
    assert read_steps(path) == 0.75  # 2 videos x 3 of 8 steps
    write_steps(path, None)
    assert not path.exists() and read_steps(path) == 0.0
