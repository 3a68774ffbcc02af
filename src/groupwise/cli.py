"""The command line: ``groupwise demo | train | eval | export | inspect | plot | compare | list | config``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from groupwise.registry import ConfigError

# The demo: chains of three additions mod 10, a warm start that imitates a removable flaw (a step whose sum
# wraps past 9 is off by one 60% of the time, so greedy decoding copies the slip), then GRPO removes it.
DEMO = {
    "name": "demo",
    "task": {"name": "lab", "ops": "+", "min_steps": 3, "max_steps": 3, "p_wrap_slip": 0.6},
    "model": {"path": "embedded:lab-tiny", "warm_start_steps": 400, "warm_start_lr": 2e-3},
    "rollout": {"prompts_per_step": 16, "group_size": 8, "max_completion_tokens": 48},
    "optim": {"lr": 1e-4},
    "trainer": {"steps": 80, "save_every": 20},
    "eval": {"n_problems": 128, "k": 4, "every": 20},
}


def _train(args) -> int:
    import time

    from groupwise import api
    from groupwise.config import load
    from groupwise.loop import distributed

    cfg = load(args.recipe, args.overrides)
    t0 = time.perf_counter()
    try:
        result = api.run(cfg, resume=args.resume, overwrite=args.overwrite)
        if distributed.is_main():
            print(summary_line(cfg, result, time.perf_counter() - t0), flush=True)
    finally:
        distributed.teardown()  # under torchrun: leave the process group cleanly
    return 0


def summary_line(cfg, result, seconds: float) -> str:
    """A finished ``train``'s last line: steps, wall time, the final held-out eval (if any), the run dir."""
    from groupwise.log import read_metrics

    rows = read_metrics(cfg.run_dir) if (cfg.run_dir / "metrics.jsonl").exists() else []
    steps = max((int(r["step"]) for r in rows if "perf/step_s" in r), default=0)
    minutes, secs = divmod(round(seconds), 60)
    out = f"done: {steps} step{'s' * (steps != 1)} in {f'{minutes} min ' if minutes else ''}{secs} s"
    after = result.get("after") if isinstance(result, dict) else None
    if isinstance(after, dict) and "eval/mean_at_k" in after:
        out += f"; held-out mean@{cfg.eval.k} {after['eval/mean_at_k']:.3f}"
        if "eval/greedy_acc" in after:
            out += f", greedy {after['eval/greedy_acc']:.3f}"
    return out + f"; run dir {cfg.run_dir}"


def _demo(args) -> int:
    from groupwise.config import load
    from groupwise.loop.trainer import train
    from groupwise.plot import plot

    cfg = load(None, [f"out_dir={args.out_dir}", *args.overrides], base=DEMO)
    print("groupwise demo: warm start (cached after the first run) -> GRPO -> held-out eval", flush=True)
    result = train(cfg, overwrite=True)
    png = plot([str(cfg.run_dir)], cfg.run_dir / "curves.png")
    before, after = result.get("before", {}), result.get("after", {})
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"held-out accuracy, {cfg.eval.n_problems} problems (run dir {cfg.run_dir})")
    for col in ("metric", "before RL", "after RL"):
        t.add_column(col, justify="right")
    for k, label in (("eval/greedy_acc", "greedy accuracy"), ("eval/mean_at_k", f"mean@{cfg.eval.k} (T=1)"),
                     ("eval/pass_at_k", f"pass@{cfg.eval.k}"), ("eval/len_mean", "completion tokens")):
        t.add_row(label, f"{before.get(k, float('nan')):.3f}", f"{after.get(k, float('nan')):.3f}")
    Console().print(t)
    print(f"curves: {png}")
    return 0


def _eval(args) -> int:
    from groupwise.checkpoint import model_dir_damage
    from groupwise.config import load
    from groupwise.eval import evaluate_run
    from groupwise.log import StorageError
    from groupwise.loop.session import is_run_dir, latest_model_dir, run_config
    from groupwise.loop.setup import build

    target = Path(args.target)
    recipe = args.recipe
    overrides = list(args.overrides)
    if is_run_dir(target):  # a run directory: its config (refused if lost or cut) and newest intact checkpoint
        recipe = recipe or run_config(target)
        model_dir = latest_model_dir(target)
    else:
        model_dir = target
        if problem := model_dir_damage(model_dir):
            raise StorageError(f"{problem}; cannot evaluate {model_dir}")
    # the weights as saved: a run's warm start is already in its checkpoint (in the weights, or as the base its
    # adapter names), so model.warm_start from the run's config must not be applied to them again
    cfg = load(recipe, [*overrides, f"model.path={model_dir}", "model.warm_start=false"])
    e = cfg.eval
    with eval_screen(args.json) as screen:  # the training screen's phases, its bar the eval's completions
        with screen.phase("loading the model", about=str(model_dir)):
            p = build(cfg, screen=screen, train=False)
        problems = p.task.test[:e.n_problems]
        rows = len(problems) * (e.k + int(e.greedy))
        with screen.phase("eval", rows, f"{len(problems)} problems, {rows} completions", bar=True):
            metrics, _ = evaluate_run(p, problems)
    if args.json:
        print(json.dumps(metrics, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"eval {model_dir} on {cfg.task.name} ({e.n_problems} problems, k={e.k})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in metrics.items():
        t.add_row(k, f"{v:.4f}")
    Console().print(t)
    return 0


@contextlib.contextmanager
def eval_screen(json_out: bool):
    """``groupwise eval``'s screen: a live bar on a terminal, a line per phase when piped (``log.Progress``). With
    ``--json`` stdout is the JSON: the bar goes to stderr where that is a terminal, else nothing is shown."""
    from rich.console import Console

    from groupwise.log import Progress

    console = Console(stderr=True) if json_out else None
    screen = Progress(None, 0, not json_out or console.is_terminal, title="eval", console=console)
    try:
        yield screen
    finally:
        screen.close()


@contextlib.contextmanager
def writing(out: str):
    """An ``--out`` that cannot be written (read-only, no space, a file in the way) is one line naming it."""
    from groupwise.log import StorageError, io_reason

    try:
        yield
    except OSError as e:
        target = Path(out).absolute()
        on_out = bool(e.filename) and Path(e.filename).absolute() in (target, *target.parents)
        if isinstance(e, FileNotFoundError | FileExistsError) and not on_out:  # an input (a run) is missing
            raise
        raise StorageError(f"--out {out}: cannot write: {io_reason(e) or e.strerror or e}") from None


def _export(args) -> int:
    from groupwise.checkpoint import model_dir_damage
    from groupwise.log import StorageError
    from groupwise.loop.session import is_run_dir, latest_model_dir
    from groupwise.models.export import export

    target = Path(args.target)
    model_dir = latest_model_dir(target) if is_run_dir(target) else target
    if problem := model_dir_damage(model_dir):
        raise StorageError(f"{problem}; cannot export {model_dir}")
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{model_dir}: not a run directory or a model directory")
    with writing(args.out):
        dirs = export(model_dir, args.out)
    for d in dirs:
        print(d)
    if (config := Path(args.out) / "adapter" / "adapter_config.json").exists():  # say where the adapter's base is
        base = json.loads(config.read_text()).get("base_model_name_or_path")
        print(f"note: adapter/ loads its base from {base} (this machine's path); elsewhere, point "
              "base_model_name_or_path in adapter/adapter_config.json at a copy of that model, or use merged/, "
              "which needs no base", file=sys.stderr)
    return 0


def _plot(args) -> int:
    from groupwise.plot import plot

    metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip()) or None  # None: the default panels
    with writing(args.out):
        print(plot(args.runs, args.out, metrics, x=args.x, smooth=args.smooth))
    return 0


def _compare(args) -> int:
    from rich.console import Console

    from groupwise.report import compare

    table, rows = compare(args.runs, args.tail, tuple(args.metrics.split(",")) if args.metrics else ())
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        Console().print(table)
    return 0


def _inspect(args) -> int:
    from groupwise.inspect_report import inspect_runs

    if len(args.runs) > 2:
        print(f"error: inspect takes one run or two, got {len(args.runs)}", file=sys.stderr)
        return 2
    with writing(args.out):
        print(inspect_runs(args.runs, args.out))
    return 0


def _list(args) -> int:
    from groupwise import plugins
    from groupwise.catalog import KINDS, registry

    for ref in args.plugin:
        plugins.import_ref(ref)
    if args.support:
        from groupwise.catalog import SUPPORT_LEGEND, support_table

        print("\n".join([*support_table(), "", SUPPORT_LEGEND]))
        return 0
    for kind in KINDS:
        if args.kind and args.kind not in kind:
            continue
        reg = registry(kind)  # groupwise's own members by name (registry.source_index): none is imported
        plugged = {n: e.origin for n, e in reg.loaded().items() if not e.builtin}
        names = [n + (f" ({plugged[n]})" if n in plugged else "") for n in reg.names()]
        print(f"{kind:20s} {', '.join(names) or '-':60s}  {reg.signature}")
    if not args.kind or args.kind in "method":  # `method: <name>` in a recipe: every member at once
        from groupwise.registry import bundles

        print(f"{'method':20s} " + ", ".join(f"{n} ({', '.join(k)})" for n, k in bundles().items()))
    return 0


def _config(args) -> int:
    import yaml

    from groupwise.config import load, to_dict

    cfg = load(args.recipe, args.overrides)
    out, m, note = to_dict(cfg), cfg.model, ""
    if not m.warm_starts:  # the SFT settings of a model that gets no warm start: said once, not shown as if active
        why = ("warm_start_steps: 0" if m.warm_start_steps == 0 else "false" if m.warm_start is False
               else "auto resolves to false for a pretrained model; true warm-starts it")
        unused = ("warm_start_steps", "warm_start_lr", "warm_start_batch")[1 if m.warm_start_steps == 0 else 0:]
        for key in unused:
            del out["model"][key]
        note = f"  # no warm start ({why}): {', '.join(unused)} unused, not shown"
    text = yaml.safe_dump(out, sort_keys=False).splitlines()
    if note:
        at = next(i for i, line in enumerate(text) if line.startswith("  warm_start:") and i > text.index("model:"))
        text[at] += note
    print("\n".join(text))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="groupwise", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    about = ("warm start + GRPO + eval on the built-in lab task (CPU: about 1 min on 2 cores, 3 min if the "
             "warm start is built instead of packaged)")
    d = sub.add_parser("demo", help=about, description=about)
    d.add_argument("--out-dir", default="runs")
    d.add_argument("overrides", nargs="*", help="key=value config overrides")
    d.set_defaults(fn=_demo)
    t = sub.add_parser("train", help="train from a YAML recipe")
    t.add_argument("recipe")
    t.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. trainer.steps=3")
    t.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    t.add_argument("--overwrite", action="store_true", help="replace an existing run of the same name")
    t.set_defaults(fn=_train)
    e = sub.add_parser("eval", help="evaluate a run directory or a HF model directory")
    e.add_argument("target")
    e.add_argument("overrides", nargs="*")
    e.add_argument("--recipe", default=None, help="task/eval settings (default: the run's own config)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=_eval)
    x = sub.add_parser("export", help="write a run's newest model for other tools (LoRA: the adapter and the "
                                      "merged model)")
    x.add_argument("target", help="a run directory, or a model / adapter directory")
    x.add_argument("--out", required=True, help="directory to write adapter/ and merged/ (or model/) into")
    x.set_defaults(fn=_export)
    pl = sub.add_parser("plot", help="PNG curves overlaying runs")
    pl.add_argument("runs", nargs="+")
    pl.add_argument("--out", default="curves.png")
    pl.add_argument("--metrics", default="")
    pl.add_argument("--x", default="step", help="step | perf/gen_tokens_total | perf/wall_s_total")
    pl.add_argument("--smooth", type=int, default=5)
    pl.set_defaults(fn=_plot)
    c = sub.add_parser("compare", help="a table of runs side by side")
    c.add_argument("runs", nargs="+")
    c.add_argument("--tail", type=int, default=10)
    c.add_argument("--metrics", default="", help="extra training metrics, comma-separated")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_compare)
    ins = sub.add_parser("inspect", help="a self-contained HTML report of a run's rollouts (or two runs side by side)")
    ins.add_argument("runs", nargs="+", metavar="RUN", help="one run directory, or two to compare")
    ins.add_argument("--out", default="report.html")
    ins.set_defaults(fn=_inspect)
    li = sub.add_parser("list", help="registered components (plugins marked with their module)")
    li.add_argument("kind", nargs="?", default="")
    li.add_argument("--plugin", action="append", default=[], help="a plugin file or module to import first")
    li.add_argument("--support", action="store_true", help="the support matrix (vLLM generator, Ray workers, "
                    "asynchronous rollouts), markdown")
    li.set_defaults(fn=_list)
    cf = sub.add_parser("config", help="print the resolved config of a recipe + overrides")
    cf.add_argument("recipe")
    cf.add_argument("overrides", nargs="*")
    cf.set_defaults(fn=_config)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; flags may come anywhere, also after the ``key=value`` overrides (argparse alone
    stops the overrides at the first flag: ``train R.yaml --resume trainer.steps=1``)."""
    p = parser()
    args, extra = p.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x or not hasattr(args, "overrides")]
    if stray:
        p.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from groupwise.models.sources import offline_by_default

    offline_by_default()  # the hub only for a hub id in model.path (models/sources.py)
    from groupwise.log import quiet_libraries

    quiet_libraries(errors_only=True)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # a task's data error is the user's to fix, like a config error; others are bugs
        from groupwise.standard.jsonl import DataError

        if not isinstance(e, DataError):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a run that stopped on purpose (RunStopped); other errors are bugs
        from groupwise.registry import RunStopped

        if not isinstance(e, RunStopped):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
