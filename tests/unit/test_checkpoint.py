"""Checkpoint manifests, verification and fallback, atomic rewrites and tolerant readers ("Trust what you see").

Every fault is injected from outside, the way a user (or a full disk, or a kill) would cause it. The tests
that name a finding fail on the code before the fix; each docstring says how.
"""

import contextlib
import copy
import hashlib
import json
import os
import resource
import signal

import pytest
import torch
import yaml

from groupwise import checkpoint as ckpt
from groupwise.cli import main
from groupwise.config import load, to_dict
from groupwise.log import Logger, StorageError, read_metrics
from groupwise.loop.session import Session, run_config
from groupwise.models.load import save_model
from groupwise.registry import ConfigError

STEP = "step_{:07d}".format


def cfg(tmp_path, *overrides):
    return load(None, [f"out_dir={tmp_path}", "name=run", "trainer.progress=false", "trainer.sinks=[jsonl]",
                       *overrides])


@pytest.fixture()
def run(tmp_path, tiny_model, tokenizer):
    """A run directory with two checkpoints (steps 1 and 2) saved by ``checkpoint.save``."""
    run_dir = cfg(tmp_path).run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "resolved_config.yaml").write_text(yaml.safe_dump(to_dict(cfg(tmp_path)), sort_keys=False))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2)))
    for step in (1, 2):
        ckpt.save(run_dir, step, tiny_model, tokenizer, {"counters": {"n": step}, "blob": torch.arange(8.0)}, 2)
    return run_dir


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def resume(tmp_path, capsys):
    session = Session(cfg(tmp_path), resume=True)
    return session, capsys.readouterr().out


def test_manifest_lists_every_file_with_its_size_and_sha256(run):
    c = run / "checkpoints" / STEP(2)
    manifest = json.loads((c / ckpt.MANIFEST).read_text())
    on_disk = sorted(p.relative_to(c).as_posix() for p in c.rglob("*") if p.is_file() and p.name != ckpt.MANIFEST)
    assert sorted(manifest["files"]) == on_disk and "model/model.safetensors" in on_disk and ckpt.STATE in on_disk
    for rel, meta in manifest["files"].items():
        data = (c / rel).read_bytes()
        assert meta == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert ckpt.damage(c) is None


def _nan_save(run_dir, model, tok):
    bad = copy.deepcopy(model)
    with torch.no_grad():
        next(bad.parameters())[0, 0] = float("nan")
    ckpt.save(run_dir, 2, bad, tok, {"counters": {}}, 2)


WEIGHTS, TOKENIZER = "model/model.safetensors", "model/tokenizer.json"
DAMAGE = {  # name: (how, the file the reason must name)
    "flipped weight byte": (lambda c: flip(c / WEIGHTS, -100), WEIGHTS),
    "flipped state byte": (lambda c: flip(c / ckpt.STATE, (c / ckpt.STATE).stat().st_size // 2), ckpt.STATE),
    "truncated weights": (lambda c: os.truncate(c / WEIGHTS, 1000), WEIGHTS),
    "deleted weights": (lambda c: (c / WEIGHTS).unlink(), WEIGHTS),
    "garbage state": (lambda c: (c / ckpt.STATE).write_bytes(b"not a checkpoint" * 64), ckpt.STATE),
    "truncated state": (lambda c: os.truncate(c / ckpt.STATE, 300), ckpt.STATE),
    "empty state": (lambda c: (c / ckpt.STATE).write_bytes(b""), ckpt.STATE),
    "deleted tokenizer": (lambda c: (c / TOKENIZER).unlink(), TOKENIZER),
    "deleted model config": (lambda c: (c / "model/config.json").unlink(), "model/config.json"),
}


@pytest.mark.parametrize("how", [*DAMAGE, "nan weights"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(how, run, tmp_path, capsys, tiny_model, tokenizer):
    """Finding 3 + 4. Before the fix the session resumed from step 2 whatever its state (checkpoints carried
    no checksum, nothing was verified) and build / restore then crashed or loaded the damage silently."""
    latest = run / "checkpoints" / STEP(2)
    if how == "nan weights":  # saved that way (a diverged run): the manifest matches, the values do not
        _nan_save(run, tiny_model, tokenizer)
        named = WEIGHTS
    else:
        DAMAGE[how][0](latest)
        named = DAMAGE[how][1]
    session, out = resume(tmp_path, capsys)
    assert session.checkpoint == run / "checkpoints" / STEP(1)
    skip = [ln for ln in out.splitlines() if STEP(2) in ln and "damaged" in ln and "skipping" in ln]
    assert len(skip) == 1 and named in skip[0], out
    assert not latest.exists() and (run / "checkpoints" / f"damaged-{STEP(2)}").is_dir()
    assert ckpt.load_state(session.checkpoint)["counters"] == {"n": 1}


def test_no_intact_checkpoint_is_one_error_naming_the_checkpoint_dir(run, tmp_path, capsys):
    """Before the fix: the damaged step 2 was taken as the resume point and no error was raised."""
    for step in (1, 2):
        (run / "checkpoints" / STEP(step) / ckpt.STATE).write_bytes(b"")
    with pytest.raises(StorageError) as e:
        Session(cfg(tmp_path), resume=True)
    msg = str(e.value)
    assert "\n" not in msg and str(run / "checkpoints") in msg and "no intact checkpoint" in msg
    assert capsys.readouterr().out.count("skipping damaged checkpoint") == 2


def test_checkpoint_without_manifest_is_used_with_one_warning(run, tmp_path, capsys):
    """Checkpoints of an older groupwise have no manifest: still resumable (with a warning), but a state that
    does not load is still damage."""
    for step in (1, 2):
        (run / "checkpoints" / STEP(step) / ckpt.MANIFEST).unlink()
    session, out = resume(tmp_path, capsys)
    assert session.checkpoint.name == STEP(2)
    assert [ln for ln in out.splitlines() if "warning" in ln] == [
        f"warning: {run / 'checkpoints' / STEP(2)}: no {ckpt.MANIFEST} (saved by an older groupwise): "
        "its files are not verified"]
    (run / "checkpoints" / STEP(2) / ckpt.STATE).write_bytes(b"garbage")
    session, out = resume(tmp_path, capsys)
    assert session.checkpoint.name == STEP(1) and f"{ckpt.STATE} does not load" in out


def test_stale_temporary_saves_are_removed_at_save_and_at_start(run, tmp_path, capsys, tiny_model, tokenizer):
    """Finding 5: ``.tmp-step_*`` directories of killed saves (a full model each) were never removed."""
    root = run / "checkpoints"
    dead = root / ".tmp-step_0000003-4194999"  # above the kernel's pid_max: no such process
    live = root / f".tmp-step_0000003-{os.getppid()}"  # a running process may still be saving
    for d in (dead, live):
        (d / "model").mkdir(parents=True)
    ckpt.save(run, 3, tiny_model, tokenizer, {"counters": {}}, 2)
    assert not dead.exists() and live.exists()
    (dead / "model").mkdir(parents=True)
    Session(cfg(tmp_path), resume=True)
    assert not dead.exists() and live.exists()
    assert "removed 1 unfinished checkpoint save(s): .tmp-step_0000003-4194999" in capsys.readouterr().out
    assert [p.name for p in ckpt.complete(run)] == [STEP(2), STEP(3)]


@contextlib.contextmanager
def file_size_limit(n_bytes):
    """Writes past ``n_bytes`` in any file fail with EFBIG (SIGXFSZ ignored), like a disk that fills up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_metrics_rewrite_that_fails_midway_keeps_every_line(tmp_path):
    """Finding 2: the resume rewrite truncated metrics.jsonl first, so a write that failed midway lost the
    earlier lines for good (and the error was a bare OSError)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "pad": "x" * 500}) + "\n" for s in range(1, 21)))
    before = path.read_bytes()
    with file_size_limit(4000), pytest.raises(StorageError) as e:
        Logger(run_dir, ("jsonl",), {}, resume_step=10)
    assert path.read_bytes() == before and "\n" not in str(e.value) and str(path) in str(e.value)
    assert "file too large" in str(e.value)
    Logger(run_dir, ("jsonl",), {}, resume_step=10)
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 11))
    assert [p.name for p in run_dir.iterdir()] == ["metrics.jsonl"]  # the failed write's temporary file is gone


def test_config_rewrite_that_fails_midway_keeps_the_old_config(run, tmp_path):
    """Finding 2: resolved_config.yaml was truncated and rewritten in place at every start."""
    path = run / "resolved_config.yaml"
    before = path.read_bytes()
    with file_size_limit(len(before) // 2), pytest.raises(StorageError) as e:
        Session(cfg(tmp_path, "trainer.steps=7"), resume=True)  # a setting a resume may change
    assert path.read_bytes() == before and str(path) in str(e.value)


def test_disk_errors_while_logging_name_the_file(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logger = Logger(run_dir, ("jsonl",), {}, resume_step=None)
    with file_size_limit(10), pytest.raises(StorageError) as e:
        logger.log(1, {"x": 1.0})
    assert str(e.value).startswith(f"{run_dir / 'metrics.jsonl'}: cannot append step 1: file too large")


def test_torn_last_line_is_skipped_with_one_note(tmp_path, capsys):
    """Finding 1: a torn last line (a kill or a full disk mid-append) was a bare JSONDecodeError naming no file."""
    path = tmp_path / "metrics.jsonl"
    good = "".join(json.dumps({"step": s, "x": s / 3}) + "\n" for s in (1, 2, 3))
    path.write_text(good + '{"step": 4, "x": 0.33')  # 21 bytes of a longer line
    assert read_metrics(tmp_path) == [{"step": s, "x": s / 3} for s in (1, 2, 3)]
    assert capsys.readouterr().err == f"warning: {path}:4: skipped a torn last line (21 bytes; an interrupted write)\n"
    Logger(tmp_path, ("jsonl",), {}, resume_step=2)  # the resume rewrite keeps the lines up to its step, verbatim
    assert path.read_text() == "".join(good.splitlines(keepends=True)[:2])


@pytest.mark.parametrize("bad", ['{"step": 2, "x"', "\xff\xfe", '[1, 2]', '{"x": 1}'])
def test_corrupt_line_before_the_last_is_an_error_naming_file_and_line(bad, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(f'{{"step": 1}}\n{bad}\n{{"step": 3}}\n'.encode("latin-1"))
    with pytest.raises(StorageError) as e:
        read_metrics(tmp_path)
    assert str(e.value).startswith(f"{path}:2: corrupt line") and "\n" not in str(e.value)


def test_compare_and_plot_read_past_a_torn_last_line(tmp_path, capsys):
    """Finding 1 for the readers: compare and plot failed with a bare JSONDecodeError."""
    rows = [{"step": s, "perf/step_s": 1.0, "reward/mean": 0.5, "reward/correct_frac": 0.5} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')
    assert main(["compare", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["steps"] == 2.0
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 0
    assert "skipped a torn last line" in capsys.readouterr().err and (tmp_path / "c.png").stat().st_size > 1000


@pytest.mark.parametrize("flag", [["--metrics", "reward/mean,reward/nope"],
                                  ["--metrics", "reward/mean", "--x", "perf/nope_total"]])
def test_plot_unknown_metric_or_x_is_an_error_listing_the_available_ones(flag, tmp_path, capsys):
    """Finding 6: plot drew an empty panel (or an empty PNG) and exited 0."""
    rows = [{"step": s, "reward/mean": 0.5, "perf/gen_tokens_total": 10.0 * s} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png"), *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err and "perf/gen_tokens_total" in err
    assert not (tmp_path / "c.png").exists()


def test_eval_of_a_run_without_its_config_names_the_config_not_model_path(run, capsys):
    """Finding 6: the run directory was taken for a model directory and the error blamed model.path."""
    (run / "resolved_config.yaml").unlink()
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / 'resolved_config.yaml'}: missing" in err and "model.path" not in err


@pytest.mark.parametrize("text", ["", "task: {name: lab}\n", "task: [unclosed\n"])
def test_run_config_refuses_an_empty_cut_or_broken_config(text, run):
    (run / "resolved_config.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        run_config(run)
    assert str(e.value).startswith(str(run / "resolved_config.yaml")) and "\n" not in str(e.value)


def test_eval_of_a_model_dir_with_truncated_weights_names_the_file(tmp_path, tiny_model, tokenizer, capsys):
    """Finding 6: a truncated safetensors file crashed eval with a SafetensorError traceback."""
    save_model(tiny_model, tokenizer, tmp_path / "m")
    os.truncate(tmp_path / "m" / "model.safetensors", 5000)
    assert main(["eval", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'm' / 'model.safetensors'} does not load" in err


def test_saved_and_exported_files_follow_the_umask(tmp_path, tiny_model, tokenizer, capsys):
    """Issue 47 item 5. Before: model.safetensors was 0600 in every checkpoint and export (safetensors writes a
    temporary file and renames it), whatever the umask, while every other file followed it."""
    old = os.umask(0o027)
    try:
        run_dir = cfg(tmp_path).run_dir
        run_dir.mkdir(parents=True)
        final = ckpt.save(run_dir, 1, tiny_model, tokenizer, {}, 2)
        assert main(["export", str(final / "model"), "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    for root in (final, tmp_path / "out" / "model"):
        modes = {p.relative_to(root).as_posix(): oct(p.stat().st_mode & 0o777) for p in root.rglob("*") if p.is_file()}
        assert "model.safetensors" in "".join(modes) and set(modes.values()) == {"0o640"}, modes
