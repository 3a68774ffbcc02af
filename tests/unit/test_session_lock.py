"""The run lock (``loop/session.py``): a second process on a running run is refused in one line naming the
owner; a lock left by a dead process, or by this process, is taken over; closing the session releases it."""

import subprocess
import sys

import pytest

from groupwise.config import load
from groupwise.log import StorageError
from groupwise.loop.session import LOCK, Session


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
    import os

    assert (tmp_path / "r" / LOCK).read_text().strip() == str(os.getpid())
    session(tmp_path, overwrite=True)  # this process's own lock (a session that raised before closing)
    s.close()
    assert not (tmp_path / "r" / LOCK).exists()
