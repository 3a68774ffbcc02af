"""Train from Python with your own reward function (TRL's signature), no recipe edits and no plugin file.

    python examples/python_api.py [key=value overrides ...]
"""

import sys

import groupwise


def lab_answer(prompts, completions, answer, **kwargs):
    """1.0 when the completion's <answer> is the gold answer (the lab's own check, written as a TRL reward)."""
    return [1.0 if f"<answer>{gold}</answer>" in text else 0.0 for text, gold in zip(completions, answer)]


if __name__ == "__main__":
    result = groupwise.train("recipes/grpo_lab.yaml", ["out_dir=runs/examples", "trainer.steps=20", *sys.argv[1:]],
                             reward_funcs=[lab_answer], overwrite=True)
    before, after = result.get("before", {}), result.get("after", {})
    print(f"held-out mean@k: {before.get('eval/mean_at_k', float('nan')):.3f} -> {after['eval/mean_at_k']:.3f}")
