"""Faults injected into real runs from outside, as a user (or a kill, or a full disk) would cause them.

One tiny run (4 steps, checkpoints at 2 and 4, ~6 s on the embedded model) is copied for every test and
damaged there; resuming must reproduce it metric for metric. Each docstring says how the code before the fix
failed ("Trust what you see", section 2).
"""

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from groupwise import checkpoint as ckpt
from groupwise.cli import main

ROOT = Path(__file__).parents[2]
RECIPE = str(ROOT / "recipes" / "grpo_lab.yaml")
ARGS = ["trainer.steps=4", "trainer.save_every=2", "trainer.keep_last=2", "trainer.threads=1",
        "trainer.progress=false", "trainer.sinks=[jsonl]", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_completion_tokens=12", "model.warm_start_steps=0", "eval.before=false", "eval.after=false",
        "reward.terms=[{name: length_penalty, max_length: 12}]",
        # a random model rarely emits EOS: stop strings make lengths (and so rewards) vary, so every step trains
        'rollout.stop=["0","1","2","3","4","5","6","7","8","9"]']
WEIGHTS = "model/model.safetensors"


def train(out_dir, *extra) -> int:
    return main(["train", RECIPE, *ARGS, f"out_dir={out_dir}", *extra])


def rows(run: Path):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("perf/") and k != "time"} for x in lines]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    assert train(out) == 0
    run = out / "grpo_lab"
    assert [p.name for p in ckpt.complete(run)] == ["step_0000002", "step_0000004"]
    assert len({r["loss/total"] for r in rows(run)}) > 1, "no step trained: the comparisons would be vacuous"
    return run


@pytest.fixture()
def run(reference, tmp_path):
    shutil.copytree(reference, tmp_path / "grpo_lab")
    return tmp_path / "grpo_lab"


def _nan_weights(c: Path) -> None:  # as a diverged run would have saved them: the manifest matches
    tensors = load_file(c / WEIGHTS)
    next(iter(tensors.values()))[0] = float("nan")
    save_file(tensors, c / WEIGHTS, metadata={"format": "pt"})
    (c / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(c)


DAMAGE = {"truncated weights": (lambda c: os.truncate(c / WEIGHTS, 4096), WEIGHTS),
          "garbage state": (lambda c: (c / ckpt.STATE).write_bytes(os.urandom(4096)), ckpt.STATE),
          "nan weights": (_nan_weights, WEIGHTS)}


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_latest_checkpoint_resumes_from_the_previous_one_bit_for_bit(how, run, reference, capsys):
    """Findings 3 + 4: before, truncated weights crashed build (SafetensorError), a garbage state crashed
    restore (UnpicklingError), NaN weights resumed silently; step 2 was intact all along."""
    latest = run / "checkpoints" / "step_0000004"
    make, named = DAMAGE[how]
    make(latest)
    assert train(run.parent, "--resume") == 0
    out = capsys.readouterr().out
    skipped = [ln for ln in out.splitlines() if "skipping damaged checkpoint" in ln]
    assert len(skipped) == 1 and str(latest) in skipped[0] and named in skipped[0], out
    assert "resuming from step_0000002" in out
    assert rows(run) == rows(reference)
    assert ckpt.damage(latest) is None and (run / "checkpoints" / "damaged-step_0000004").is_dir()


def test_torn_metrics_line_does_not_stop_resume_compare_or_plot(run, reference, capsys):
    """Finding 1: a torn last line made --resume, compare and plot fail with a bare JSONDecodeError."""
    metrics = run / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 5, "time": 1.0, "reward/me')
    shutil.rmtree(run / "checkpoints" / "step_0000004")  # resume from step 2, so steps 3 and 4 run again
    torn = f"warning: {metrics}:5: skipped a torn last line (35 bytes; an interrupted write)\n"
    assert main(["compare", str(run), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)[0]["steps"] == 4.0 and cap.err == torn
    assert main(["plot", str(run), "--out", str(run / "curves.png")]) == 0
    assert capsys.readouterr().err == torn
    assert train(run.parent, "--resume") == 0
    assert torn in capsys.readouterr().out
    assert rows(run) == rows(reference)


# Python ignores SIGXFSZ at start-up; restored, a write past the file-size limit kills the process mid-write
KILLED_AT_LIMIT = ("import signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                   "from groupwise.cli import main; sys.exit(main(sys.argv[1:]))")


def _killed_at(limit: int, args: list[str]) -> int:
    """Run ``groupwise ARGS`` in a process that is killed by the kernel when it writes past ``limit`` bytes
    in any file."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    setlimit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # noqa: E731
    return subprocess.run([sys.executable, "-c", KILLED_AT_LIMIT, *args], env=env, preexec_fn=setlimit,
                          capture_output=True, timeout=600).returncode


@pytest.mark.parametrize("name", ["resolved_config.yaml", "metrics.jsonl"])
def test_kill_inside_a_rewrite_at_start_keeps_the_file(name, run, reference):
    """Finding 2: both files were truncated and rewritten in place at every start, so a kill inside the
    rewrite lost the earlier metric lines for good (or left a cut config)."""
    (run / "rollouts.jsonl").unlink()  # its own rewrite at start is not this test's subject
    config, metrics = (run / n for n in ("resolved_config.yaml", "metrics.jsonl"))
    assert config.stat().st_size * 2 < metrics.stat().st_size
    limit = config.stat().st_size // 2 if name == config.name else (config.stat().st_size * 2)
    before = (run / name).read_bytes()
    assert _killed_at(limit, ["train", RECIPE, *ARGS, f"out_dir={run.parent}", "--resume"]) == -signal.SIGXFSZ, \
        "the fault never fired"
    assert (run / name).read_bytes() == before
    shutil.rmtree(run / "checkpoints" / "step_0000004")
    assert train(run.parent, "--resume") == 0
    assert rows(run) == rows(reference) and not list(run.glob(f".{name}.tmp-*"))


def test_eval_refuses_an_empty_resolved_config(run, capsys):
    """Finding 2: with an empty resolved_config.yaml, `groupwise eval RUN` silently evaluated the default task."""
    (run / "resolved_config.yaml").write_text("")
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / 'resolved_config.yaml'}: empty" in err and "--recipe" in err


def test_eval_skips_truncated_latest_weights_and_refuses_them_when_named(run, capsys):
    """Finding 6: truncated weights crashed eval with a SafetensorError traceback naming no file."""
    latest = run / "checkpoints" / "step_0000004"
    os.truncate(latest / WEIGHTS, 4096)
    assert main(["eval", str(run), "eval.n_problems=2", "eval.k=1", "--json"]) == 0
    cap = capsys.readouterr()
    assert 0 <= json.loads(cap.out)["eval/mean_at_k"] <= 1
    assert cap.err.count("\n") == 1 and f"skipping damaged checkpoint {latest}: {WEIGHTS} is 4096 bytes" in cap.err
    assert main(["eval", str(latest / "model"), "eval.n_problems=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(latest) in err and WEIGHTS in err


@contextlib.contextmanager
def _mounted(path: Path, options: str):
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only_copy(src: Path, dst: Path):
    """``src`` copied to ``dst`` and made read-only: a read-only tmpfs where mounting works (root), else chmod."""
    with _mounted(dst.parent, "size=64m") as mounted:
        shutil.copytree(src, dst)
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(dst.parent)], check=True)
        else:
            for p in (dst, *dst.rglob("*")):
                p.chmod(p.stat().st_mode & ~0o222)
        probe = dst / "probe"
        with contextlib.suppress(OSError):
            probe.touch()
            pytest.skip("cannot make a read-only directory here (root without mount)")
        yield dst


def test_read_only_run_dir_is_one_line(run, tmp_path, capsys):
    """Finding 5: resuming in a read-only run directory was an OSError traceback."""
    with read_only_copy(run, tmp_path / "ro" / "grpo_lab") as ro:
        before = sorted((p.relative_to(ro), p.stat().st_size) for p in ro.rglob("*"))
        assert train(ro.parent, "--resume") == 2
        assert sorted((p.relative_to(ro), p.stat().st_size) for p in ro.rglob("*")) == before
    err = capsys.readouterr().err
    # the run lock is the first thing written, so that is what the line names (before the lock: the config)
    assert err.count("\n") == 1 and f"{ro}: cannot create the run directory or its lock:" in err
    assert "read-only file system" in err or "permission denied" in err


@contextlib.contextmanager
def small_disk(path: Path, n_bytes: int):
    """A directory where writing past ~``n_bytes`` fails: a tmpfs that size (ENOSPC) where mounting works,
    else a per-file size limit (EFBIG). Yields the reason the error must give."""
    with _mounted(path, f"size={n_bytes}") as mounted:
        if mounted:
            yield "no space left on device (ENOSPC)"
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
        try:
            yield "file too large (EFBIG)"
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, old)


def test_disk_full_while_saving_is_one_line_and_leaves_no_temporary_checkpoint(tmp_path, capsys):
    """Finding 5: a full disk while saving the state was an internal RuntimeError (torch's zip writer) that
    did not mention the disk, and the .tmp-step_* directory (a full model) stayed behind."""
    disk = tmp_path / "disk"
    run = disk / "grpo_lab"
    with small_disk(disk, 6 << 20) as reason:  # the weights (3.2 MB) fit, the optimizer state (6.5 MB) does not
        assert train(disk) == 2
        assert not list((run / "checkpoints").iterdir()) and len(rows(run)) == 2
    err = capsys.readouterr().err
    assert err == f"error: {run / 'checkpoints' / 'step_0000002'}: cannot save the checkpoint: {reason}\n"
