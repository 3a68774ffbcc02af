import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from groupwise.cli import main


def test_config_errors_are_one_line_and_exit_2(capsys):
    assert main(["config", "recipes/grpo_lab.yaml", "trainer.stepz=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trainer.stepz" in err and "allowed:" in err
    assert main(["config", "recipes/grpo_lab.yaml", "advantage.name=grpp"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'grpo'" in err and "dr_grpo" in err and "rloo" in err


def test_config_prints_resolved_yaml(capsys):
    assert main(["config", "recipes/grpo_lab.yaml", "trainer.steps=3"]) == 0
    out = capsys.readouterr().out
    assert "steps: 3" in out and "name: ppo_clip" in out


def test_list_shows_every_kind(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for kind in ("advantage", "loss", "generator", "replay buffer", "selector", "credit", "teacher"):
        assert kind in out


def test_missing_recipe_is_an_error(capsys):
    assert main(["train", "recipes/nope.yaml"]) == 2
    assert "recipe not found" in capsys.readouterr().err


def test_entry_point_runs_as_module():
    src = str(Path(__file__).parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "groupwise.cli", "list", "advantage"], capture_output=True, text=True,
                         env=env)
    assert out.returncode == 0 and "grpo" in out.stdout


def test_compare_and_plot(tmp_path, capsys):
    for name, acc in (("a", 0.5), ("b", 0.7)):
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": 0, "eval/mean_at_k": 0.3, "eval/len_mean": 30.0}]
        rows += [{"step": s, "perf/step_s": 1.0, "reward/mean": acc, "reward/correct_frac": acc,
                  "rollout/completion_len_mean": 20.0 + s, "perf/gen_tokens_total": 100.0 * s} for s in range(1, 6)]
        rows += [{"step": 5, "eval/mean_at_k": acc, "eval/len_mean": 25.0}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--tail", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[1]["eval/mean_at_k"] == 0.7 and rows[1]["eval/mean_at_k (start)"] == 0.3
    assert rows[0]["rollout/completion_len_mean"] == 24.5 and rows[0]["perf/gen_tokens_total"] == 500.0
    png = tmp_path / "c.png"
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(png),
                 "--x", "perf/gen_tokens_total"]) == 0
    assert png.stat().st_size > 1000


def test_flags_may_come_after_the_overrides():
    import pytest

    from groupwise.cli import parse

    a = parse(["train", "R.yaml", "--resume", "trainer.steps=1"])
    assert (a.recipe, a.overrides, a.resume) == ("R.yaml", ["trainer.steps=1"], True)
    a = parse(["train", "R.yaml", "a=1", "--overwrite", "b=2"])
    assert a.overrides == ["a=1", "b=2"] and a.overwrite
    a = parse(["eval", "RUN", "--json", "eval.n_problems=8"])
    assert (a.target, a.overrides, a.json) == ("RUN", ["eval.n_problems=8"], True)
    with pytest.raises(SystemExit) as e:
        parse(["train", "R.yaml", "--frobnicate", "a=1"])
    assert e.value.code == 2


def test_resume_without_a_run_says_it_starts_fresh(tmp_path, capsys):
    from groupwise.config import load
    from groupwise.loop.session import Session

    Session(load(None, [f"out_dir={tmp_path}", "name=r"]), resume=True)
    assert f"--resume: nothing to resume at {tmp_path / 'r'} (no run there yet); starting a fresh run" in \
        capsys.readouterr().out


def test_inspect_skips_a_torn_last_rollouts_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    whole = json.dumps({"step": 1, "signals": [], "groups": []})
    (run / "rollouts.jsonl").write_text(whole + "\n" + whole[:17])  # killed mid-append
    assert main(["inspect", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert "skipped a torn last line" in capsys.readouterr().err and (tmp_path / "r.html").stat().st_size > 1000


def test_an_out_path_that_cannot_be_written_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/correct_frac": 0.5}) + "\n")
    (tmp_path / "afile").write_text("x")
    for cmd in (["inspect", str(run)], ["plot", str(run)]):
        out = tmp_path / "afile" / "report.out"  # a file where a directory should be
        assert main([*cmd, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --out {out}: cannot write") and "\n" not in err


def test_compare_prints_counts_as_integers(tmp_path, capsys):
    """Issue 47 item 5. Before: 'steps 5.000' and 'perf/gen_tokens_total 500.000'."""
    (tmp_path / "a").mkdir()
    rows = [{"step": s, "perf/step_s": 1.0, "reward/mean": 0.5, "perf/gen_tokens_total": 100.0 * s,
             "perf/wall_s_total": 2.0 * s} for s in range(1, 6)]
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["compare", str(tmp_path / "a")]) == 0
    cells = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in capsys.readouterr().out.splitlines()
             if ln.count("│") == 3}
    assert cells["steps"] == "5" and cells["perf/gen_tokens_total"] == "500"
    assert cells["reward/mean"] == "0.500" and cells["perf/wall_s_total"] == "10.000"


def test_eval_lines_name_the_step_once(monkeypatch):
    """Issue 47 item 5. Before: '[step_20] step 20: mean@4 ...' (and the same in the federated and agon drivers)."""
    from types import SimpleNamespace as NS

    from groupwise.loop import trainer
    from groupwise.methods import agon
    from groupwise.methods.fgrpo import federated

    notes = []
    session = NS(log_eval=lambda step, tag, metrics, records, note: notes.append(note),
                 logger=NS(log=lambda step, m: None),
                 progress=NS(note=notes.append, phase=lambda *a, **kw: contextlib.nullcontext()))
    m = {"eval/mean_at_k": 0.5, "eval/greedy_acc": 0.25, "eval/len_mean": 9.0, "eval/cascade_ab_acc": 0.5,
         "eval/cascade_ba_acc": 0.5, "eval/solo_a_acc": 0.5, "eval/solo_b_acc": 0.5, "eval/macro_mean_at_k": 0.5,
         "eval/worst_mean_at_k": 0.5}
    monkeypatch.setattr(trainer, "evaluate_run", lambda p, problems: (m, []))
    monkeypatch.setattr(agon, "cascade_eval", lambda players, cfg, acfg: (m, []))
    monkeypatch.setattr(federated, "eval_metrics", lambda per_client: m)
    trainer._eval(NS(cfg=NS(eval=NS(k=4, n_problems=1, greedy=True)), task=NS(test=[])), 20, session, "step_20")
    agon.run_eval([], None, None, session, 20)
    federated.Loop.evaluate(NS(session=session, state=NS(weights=None)), NS(evaluate=lambda w: {0: {}}), 20)
    assert [n.split(":")[0] for n in notes] == ["eval step 20"] * 3 and not any("step_" in n for n in notes)
    assert notes[0] == "eval step 20: mean@4 0.500  greedy 0.250  len 9.0"


def test_compare_names_the_steps_it_averages_and_demo_help_the_readmes_time(tmp_path, capsys):
    import pytest

    from groupwise.cli import parse
    from groupwise.report import compare

    for name, steps in (("a", 5), ("b", 5), ("c", 3)):
        (tmp_path / name).mkdir()
        rows = [{"step": s, "perf/step_s": 1.0, "reward/mean": 0.5} for s in range(1, steps + 1)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b, c = (str(tmp_path / x) for x in "abc")
    assert compare([a, b], 10)[0].title.endswith("mean of the last 5 steps)")
    assert compare([a, c], 4)[0].title.endswith("the last 3 / 4 steps)")
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    took = re.search(r"The whole `groupwise demo`.*? took (\d+) min", readme, re.S).group(1)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        parse(["demo", "--help"])
    assert f"about {took} min on 2 cores" in " ".join(capsys.readouterr().out.split())


def test_train_ends_with_a_summary_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    recipe = Path(__file__).parents[2] / "recipes" / "fake_generator_lab.yaml"
    assert main(["train", str(recipe), "trainer.steps=2", f"out_dir={tmp_path}", "eval.before=false"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    run = tmp_path / "fake_generator_lab"
    assert re.fullmatch(rf"done: 2 steps in \d+ s; held-out mean@4 0\.\d{{3}}; run dir {run}", last), last


def test_the_progress_bar_keeps_its_times_whole_at_80_columns():
    import io

    from rich.console import Console

    from groupwise.log import Progress

    buf = io.StringIO()
    p = Progress(80, 12, True, console=Console(file=buf, width=80, force_terminal=True, color_system=None))
    p.update(13, {"reward/mean": 0.5, "reward/correct_frac": 0.5, "rollout/completion_len_mean": 11.0,
                  "perf/gen_tokens_per_s": 86237.0})
    p.close()
    text = buf.getvalue().replace("\r", "\n")
    lines = [re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", x) for x in text.splitlines()]
    line = [x for x in lines if "13/80" in x][-1]  # before: "13/80 0:00:… -:--:… reward ..."
    assert re.search(r"13/80 \d:\d\d:\d\d (-:--:--|\d:\d\d:\d\d) reward", line), line


def test_compare_and_plot_say_when_eval_k_differs(tmp_path, monkeypatch):
    """Issue 31: mean@4 and mean@8 were put under one name without a word."""
    from groupwise.plot import plot
    from groupwise.report import compare

    for name, k in (("a", 4), ("b", 8), ("c", 4)):
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": 0, "eval/mean_at_k": 0.3}, {"step": 1, "perf/step_s": 1.0, "reward/mean": 0.5},
                {"step": 1, "eval/mean_at_k": 0.4}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "resolved_config.yaml").write_text(f"eval:\n  k: {k}\n")
    a, b, c = (str(tmp_path / x) for x in "abc")
    table, summaries = compare([a, b], 10)
    assert "eval.k differs (4 / 8)" in table.title and [s["eval.k"] for s in summaries] == ["4", "8"]
    assert "eval.k" not in compare([a, c], 10)[0].title
    import matplotlib.axes

    seen, orig = [], matplotlib.axes.Axes.plot

    def spy(self, *args, **kw):
        seen.append(kw.get("label"))
        return orig(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    plot([a, b], tmp_path / "k.png", metrics=("eval/mean_at_k",))
    plot([a, c], tmp_path / "same.png", metrics=("eval/mean_at_k",))
    assert seen == ["a (eval.k 4)", "b (eval.k 8)", "a", "c"]


def test_config_does_not_show_warm_start_settings_a_model_does_not_use(tmp_path, capsys):
    """Issue 47: the real-model recipe listed warm_start_steps/_lr/_batch as if they applied (``auto`` does not
    warm-start a pretrained model)."""
    import yaml

    from groupwise.config import load, to_dict

    recipe = str(Path(__file__).parents[2] / "recipes" / "smollm2_math.yaml")
    assert main(["config", recipe]) == 0
    out = capsys.readouterr().out
    model = yaml.safe_load(out)["model"]
    assert not {"warm_start_steps", "warm_start_lr", "warm_start_batch"} & set(model), model
    assert "warm_start: auto  # no warm start (auto resolves to false for a pretrained model" in out
    (tmp_path / "printed.yaml").write_text(out)  # what it prints loads back to the same settings
    assert to_dict(load(tmp_path / "printed.yaml")) == to_dict(load(recipe))
    for args in ([recipe, "model.warm_start=true"], ["recipes/grpo_lab.yaml"]):  # a warm start: its settings shown
        assert main(["config", *args]) == 0
        out = capsys.readouterr().out
        assert "warm_start_steps:" in out and "no warm start" not in out
    assert main(["config", "recipes/grpo_lab.yaml", "model.warm_start_steps=0"]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert model["warm_start_steps"] == 0 and "warm_start_lr" not in model


def test_the_readmes_error_examples_are_what_the_cli_prints(capsys):
    """Issue 47: README showed an `allowed:` list from before trainer.data_parallel existed."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    shown = re.findall(r"^\$ groupwise (train .*)\n(error: .*)$", readme, re.M)
    assert len(shown) == 2, shown
    for command, error in shown:
        assert main(command.split()) == 2
        assert capsys.readouterr().err.strip() == error
