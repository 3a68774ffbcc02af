"""A verifiers environment written against verifiers' own v1 API (``verifiers.v1``: a Taskset of Tasks, ``@vf.reward``
scoring, a Toolset of ``@vf.tool`` methods); nothing in it is groupwise's. Chains of additions modulo 10, asked as
the reasoning lab asks them (``3+5+2+7``), answered with ``<answer>N</answer>``.

    # a groupwise recipe
    task: {name: verifiers, env: examples/verifiers_arith.py:ArithTaskset, env_args: {size: 2000},
           reference_field: solution}
    reward: {terms: [{name: environment}]}

``solution`` is a worked trace (``<think>3+5=8;8+2=0;0+7=7;so 7.</think><answer>7</answer>``): the SFT target of a
warm start. The calculator toolset is offered as ``calculator_add`` to a model whose chat template carries tools
(``rollout.tools: {protocol: chat}``).
"""

import random
import re

import verifiers.v1 as vf

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


class ArithConfig(vf.TasksetConfig):
    size: int = 2000
    """How many chains the taskset yields."""
    terms: int = 4
    """Numbers per chain (terms - 1 additions)."""
    seed: int = 0


class ArithData(vf.TaskData):
    answer: str
    solution: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        """1 when the reply's last <answer> is the chain's value mod 10."""
        found = ANSWER.findall(trace.last_reply)
        return float(bool(found) and found[-1].strip() == task.answer)

    @vf.metric
    async def answered(self, trace: vf.Trace) -> float:
        return float("<answer>" in trace.last_reply)


class Calculator(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two digits modulo 10.

        Args:
            a: the first digit
            b: the second digit
        """
        return (int(a) + int(b)) % 10


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.size):
            xs = [rng.randrange(10) for _ in range(self.config.terms)]
            acc, steps = xs[0], []
            for x in xs[1:]:
                steps.append(f"{acc}+{x}={(acc + x) % 10}")
                acc = (acc + x) % 10
            yield ArithTask(ArithData(prompt="+".join(map(str, xs)), answer=str(acc),
                                      solution=f"<think>{';'.join(steps)};so {acc}.</think><answer>{acc}</answer>"),
                            self.config.task)

    @classmethod
    def toolsets(cls, config: ArithConfig) -> list[vf.Toolset]:
        return [Calculator(vf.ToolsetConfig())]


__all__ = ["ArithTaskset"]
