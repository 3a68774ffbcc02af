"""Ctrl-C / SIGTERM in a run (``Session.signals``): the first asks the loop to stop after its step and save, a
second aborts; under torchrun the launcher forwards the terminal's Ctrl-C to every rank, which then sees it
twice at once: that second copy is the same interrupt, not an abort (issue 31: every rank aborted unsaved)."""

import os
import signal

import pytest

from groupwise.config import load
from groupwise.loop import session as session_mod
from groupwise.loop.session import Session


def twice(tmp_path, monkeypatch, launched: bool, gap: float) -> Session:
    if launched:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    now = [100.0]
    monkeypatch.setattr(session_mod.time, "monotonic", lambda: now[0])
    s = Session(load(None, [f"out_dir={tmp_path}", "name=r", "trainer.progress=false"]))
    with s.signals():
        os.kill(os.getpid(), signal.SIGINT)
        assert s.stopping
        now[0] += gap
        os.kill(os.getpid(), signal.SIGINT)  # the launcher's forward (gap 0.01) or a real second Ctrl-C
    s.close()
    return s


def test_under_torchrun_the_forwarded_copy_of_a_ctrl_c_does_not_abort(tmp_path, monkeypatch):
    assert twice(tmp_path, monkeypatch, launched=True, gap=0.01).stopping


@pytest.mark.parametrize(("launched", "gap"), [(False, 0.01), (True, 10.0)])
def test_a_second_interrupt_aborts(tmp_path, monkeypatch, launched, gap):
    with pytest.raises(KeyboardInterrupt):
        twice(tmp_path, monkeypatch, launched, gap)
