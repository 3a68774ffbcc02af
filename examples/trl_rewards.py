"""Reward functions in the form TRL's GRPOTrainer takes (``reward_funcs=[...]``): groupwise runs them unchanged
through its ``python`` reward term.

    reward:
      terms:
        - {name: python, function: examples/trl_rewards.py:boxed_answer, weight: 1.0}
        - {name: python, function: examples/trl_rewards.py:concise, weight: 0.1}

Each gets the batch's ``prompts`` and ``completions`` (strings, or chat messages when the prompts are
chats), ``completion_ids`` and every dataset column as a list (``answer`` here), and returns one float per
completion, or None where it does not apply.
"""

import re

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def text_of(completion):
    return completion[0]["content"] if isinstance(completion, list) else completion


def boxed_answer(completions, answer, **kwargs):
    """1.0 if the last \\boxed{...} holds the gold answer's final number, 0.0 if not; None if the gold has none."""
    rewards = []
    for completion, gold in zip(completions, answer):
        numbers = NUMBER.findall(str(gold).replace(",", ""))
        if not numbers:
            rewards.append(None)  # not applicable: this row's gold answer is not a number
            continue
        boxes = BOXED.findall(text_of(completion))
        rewards.append(1.0 if boxes and boxes[-1].strip().replace(",", "") == numbers[-1] else 0.0)
    return rewards


def concise(completions, completion_ids, trainer_state=None, log_metric=None, **kwargs):
    """A length bonus in [0, 1]: 1 for an empty completion, 0 at 256 tokens or more."""
    lengths = [len(ids) for ids in completion_ids]
    if log_metric is not None:  # TRL passes this callable; groupwise logs it as reward/concise/mean_tokens
        log_metric("mean_tokens", sum(lengths) / max(len(lengths), 1))
    return [max(0.0, 1.0 - n / 256) for n in lengths]
