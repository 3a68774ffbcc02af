"""The run lock (``loop/session.py``): a second process on a running run is refused in one line naming the
owner, also while the first is still taking it (atomic); a lock left by a dead process, or by this process, is
taken over, also while a worker forked from the dead one still runs; closing the session releases it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from groupwise.config import load
from groupwise.log import StorageError
from groupwise.loop.session import LOCK, Session, release_lock, take_lock


def session(tmp_path, **kw) -> Session:
    return Session(load(None, [f"out_dir={tmp_path}", "name=r", "trainer.progress=false"]), **kw)


def test_a_live_owner_refuses_a_second_session(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "r").mkdir()
        (tmp_path / "r" / LOCK).write_text(f"{owner.pid}\n")
        for kw in ({"resume": True}, {"overwrite": True}):
            refused = rf"r: in use by process {owner.pid} \(.*\.lock\); wait for it"
            with pytest.raises(StorageError, match=refused) as e:
                session(tmp_path, **kw)
            assert "\n" not in str(e.value)
        assert not (tmp_path / "r" / "resolved_config.yaml").exists()  # refused before writing anything
    finally:
        owner.kill()
        owner.wait()


def test_a_dead_owners_lock_is_taken_over_and_released_on_close(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / LOCK).write_text(f"{dead.pid}\n")
    s = session(tmp_path)
    assert (tmp_path / "r" / LOCK).read_text().strip() == str(os.getpid())
    session(tmp_path, overwrite=True)  # this process's own lock (a session that raised before closing)
    s.close()
    assert not (tmp_path / "r" / LOCK).exists()


SLOW_OWNER = """
import os, sys, time
from pathlib import Path
from groupwise.loop import session
real, slow = os.getpid, [True]
def getpid():  # the first call, in take_lock, waits 3 s: a wide window before the pid is written
    if slow:
        slow.clear()
        time.sleep(3)
    return real()
os.getpid = getpid
session.take_lock(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(2)
"""


def test_taking_the_lock_is_atomic(tmp_path):
    """While the first process is inside ``take_lock`` (the lock file exists, its pid not written yet: widened
    to 3 s here), a second process is refused; it was the old lock's window, in which both ran on one run."""
    run = tmp_path / "r"
    first = subprocess.Popen([sys.executable, "-c", SLOW_OWNER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run / LOCK).exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        with pytest.raises(StorageError, match=r"r: in use by (another process|process \d+) \(.*\.lock\)") as e:
            take_lock(run)
        assert "\n" not in str(e.value)
        assert first.stdout.readline().strip() == "held"  # the first process got it, the second did not
    finally:
        first.kill()
        first.wait()
    take_lock(run)  # the owner is dead: its lock is free
    release_lock(run)
    assert not (run / LOCK).exists()


FORKING_OWNER = """
import os, sys, time
from pathlib import Path
from groupwise.loop import session
session.take_lock(Path(sys.argv[1]))
child = os.fork()
if child == 0:  # a forked worker (process isolation) that outlives its trainer
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    time.sleep(30)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # the trainer dies without closing its session (as under SIGKILL)
"""


def test_a_forked_worker_does_not_keep_a_dead_owners_lock(tmp_path):
    """A ``flock`` is shared with forked children: a reward worker forked from a SIGKILLed trainer would keep its
    run locked, so children drop it at the fork."""
    run = tmp_path / "r"
    owner = subprocess.run([sys.executable, "-c", FORKING_OWNER, str(run)], capture_output=True, text=True, timeout=120)
    worker = int(owner.stdout)
    try:
        assert (run / LOCK).exists()
        os.kill(worker, 0)  # still running
        take_lock(run)  # yet the lock is free
        release_lock(run)
    finally:
        os.kill(worker, signal.SIGKILL)
