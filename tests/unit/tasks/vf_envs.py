"""verifiers environments for the ``verifiers`` task's tests, in both of verifiers' forms: v1 tasksets (one whose
reward raises on some answers, one that hangs, one infinite), and legacy ``load_environment`` functions (a
SingleTurnEnv, a ToolEnv, one with a group reward function)."""

import asyncio
import time

import verifiers.v1 as vf


class QAData(vf.TaskData):
    answer: str


class QATask(vf.Task[QAData]):
    @vf.reward(weight=2.0)
    async def exact(self, task: QAData, trace: vf.Trace) -> float:
        if trace.last_reply == "boom":
            raise RuntimeError("judge unreachable")
        if trace.last_reply == "hang":
            time.sleep(3600)
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages) > 0)

    @vf.metric
    async def length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class Lookup(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def capital(self, country: str) -> str:
        """The capital of a country.

        Args:
            country: its name
        """
        await asyncio.sleep(0)
        return {"France": "Paris", "Peru": "Lima"}.get(country, "unknown")


class QAConfig(vf.TasksetConfig):
    n: int = 20
    system: str = ""


class QATaskset(vf.Taskset[QATask, QAConfig]):
    def load(self):
        for i in range(self.config.n):
            yield QATask(QAData(id=f"q{i}", prompt=f"capital #{i}?", answer="Paris" if i % 2 else "Lima",
                                system_prompt=self.config.system or None), self.config.task)

    @classmethod
    def toolsets(cls, config):
        return [Lookup(vf.ToolsetConfig())]


class EndlessTaskset(vf.Taskset[QATask, QAConfig]):
    INFINITE = True

    def load(self):
        i = 0
        while True:
            yield QATask(QAData(id=f"e{i}", prompt=f"#{i}", answer="x"), self.config.task)
            i += 1


def legacy_single(n: int = 10):
    import verifiers as v0
    from datasets import Dataset

    rows = [{"question": f"{i}+{i}", "answer": str(2 * i)} for i in range(n)]

    def correct(completion, answer, **kwargs):
        return float(completion[-1]["content"].strip() == answer)

    def polite(completion):
        if completion[-1]["content"] == "rude":
            raise ValueError("no manners")
        return 1.0

    return v0.SingleTurnEnv(dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows[:3]),
                            system_prompt="Answer with the number.",
                            rubric=v0.Rubric(funcs=[correct, polite], weights=[1.0, 0.25]))


def legacy_tools():
    import verifiers as v0
    from datasets import Dataset

    def double(x: int) -> int:
        """Double a number.

        Args:
            x: the number
        """
        return 2 * x

    def called(completion):
        return float(any(m["role"] == "tool" for m in completion))

    rows = [{"question": f"double {i}", "answer": str(2 * i)} for i in range(8)]
    return v0.ToolEnv(dataset=Dataset.from_list(rows), tools=[double],
                      rubric=v0.Rubric(funcs=[called], weights=[1.0]))


def legacy_group():
    import verifiers as v0
    from datasets import Dataset

    def ranked(completions, **kwargs) -> list[float]:
        return [0.0] * len(completions)

    return v0.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}] * 4),
                            rubric=v0.Rubric(funcs=[ranked], weights=[1.0]))
