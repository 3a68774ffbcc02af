"""LoRA through peft against full fine-tuning: does GRPO training only a LoRA adapter learn the demo setting?

Setting (fixed before the runs): the demo's GRPO (recipes/grpo_lab.yaml: three additions mod 10, a warm start
that copies a wrapping slip, 16 x 8, 48 tokens, 80 steps, eval every 20 on 128 held-out problems, k = 4) with
every weight trained at lr 1e-4 (its tuned value), against recipes/lora_lab.yaml: the same run training a
rank-8 adapter on every linear layer (alpha 16) at lr 1e-3 (the usual ~10x for adapters; not tuned here).
3 seeds. Reported: held-out mean@4 / greedy before and after, trained parameters, checkpoint size, s/step.

    PYTHONPATH=src python experiments/lora.py --jobs 1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT = "lora"
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]"]
ARMS = {"full": ("recipes/grpo_lab.yaml", COMMON), "lora": ("recipes/lora_lab.yaml", COMMON)}
KEYS = ("mean_at_k", "greedy_acc", "len_mean")


def checkpoint_bytes(run: Path) -> float:
    model = sorted((run / "checkpoints").glob("step_*"))[-1] / "model"
    return float(sum(f.stat().st_size for f in model.glob("*.safetensors")))


def trained_weights() -> str:
    """Trained / all weights of the lab-tiny model with lora_lab.yaml's adapter."""
    from groupwise.config import load
    from groupwise.models import lora, tiny

    model = tiny.build_model("lab-tiny", tiny.build_tokenizer())
    total = sum(p.numel() for p in model.parameters())
    adapted = lora.wrap(model, load("recipes/lora_lab.yaml").model.lora)
    n = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    return f"LoRA trains {n:,} of the {total:,} weights ({n / total:.1%}).\n\n"


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    runs = {}
    for arm, (recipe, overrides) in ARMS.items():
        runs.update(harness.run_arms(EXPERIMENT, recipe, {arm: overrides}, args))
    rows = {"warm start (step 0)": {k: harness.agg([harness.summary(d)["before"][f"eval/{k}"] for d in runs["full"]])
                                    for k in KEYS}}
    for arm, dirs in runs.items():
        rows[arm] = harness.eval_cells(dirs, KEYS)
        rows[arm]["weights MB"] = harness.agg([checkpoint_bytes(d) / 1e6 for d in dirs])
        rows[arm]["s/step"] = harness.agg([harness.tail_mean(d, "perf/step_s", 10**9) for d in dirs])
    plot = harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc", "reward/correct_frac"],
                               out_dir / "curves.png")
    lines = [f"# {EXPERIMENT}\n\nseeds {args.seeds}; held-out mean@4 (T = 1) and greedy on 128 problems.\n\n",
             trained_weights(),
             harness.table(rows, [*KEYS, "weights MB", "s/step"]), "\nHeld-out mean@4 at every evaluation:\n\n",
             harness.eval_curve(runs)]
    harness.write_report(out_dir, lines, [plot])


if __name__ == "__main__":
    main()
