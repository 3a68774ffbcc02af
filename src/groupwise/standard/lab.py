"""The reasoning lab: procedural chain arithmetic with an exact verifier and dialable trace pathologies.

One family unifies the specs' "ArithTrace" (methods 1-8) and "ToyArith" (methods 9-16). A problem is a
left-to-right chain ``x0 op1 x1 ... opk xk`` over digits, evaluated modulo ``modulus`` (no precedence);
its difficulty is the number of operations k. The reference (long) trace is::

    <think>3+5=8;8-2=6;6+7=3;so 3.</think><answer>3</answer>

Each step ``acc op x = result;`` needs only one digit operation, so a ~1M-parameter model can learn it.
``so X.`` is the answer commitment (where the answer emerges, used by DRE and drift shaping). Warm-start
traces can carry pathologies, each a probability or count in the config (all 0 by default):

  p_slip       a step's result is a random wrong digit (headroom: RL can remove it)
  p_wrap_slip  a step whose exact value leaves [0, modulus) is off by one (a flaw greedy decoding copies
               once it exceeds 0.5)
  p_fix        a wrong step is followed by ``wait`` and the right recomputation (productive reflection)
  p_drift      a correct ``so X.`` is followed by ``wait``, a botched step and a wrong ``so Y.`` (drift)
  p_filler     the commitment is followed by 1-3 filler words (``well`` / ``ok`` / ``note`` / ``hmm``): verbose style
               that the clean reference (the privileged view) lacks, RLCSD's style drift (after the commitment, so
               the steps keep their positions: fillers between steps stop the tiny model from learning to add)
  max_checks   0..max_checks redundant ``chk <last step>;`` re-checks after the commitment (overthinking);
               ``check_correct_bonus`` adds that many more allowed checks to traces that end correct
  modes        completions start with a mode tag: <NT> answer only, <SH> two operations per step, <LG> long

Reference solutions (``Problem.reference``) are always clean long traces. ``env_latency_s`` sleeps in
``verify`` to simulate a per-rollout environment call (a tool round trip). ``p_early_exit`` mixes in traces
that answer after a partial clean prefix (value estimates for RREDCoT); ``privileged_frac`` mixes
warm-start examples shown with the problem's reference solution in the prompt (for privileged teachers).

``label_noise`` corrupts the gold answer of a share of TRAINING problems (the J_Q noise trade-off): the
verifier then rewards the corrupted answer on them. Whether a problem is corrupted, and how, is a function of
its prompt text alone (``stable_seed("lab-label-noise", prompt)``), so the same chain always carries the same
wrong label, in every seed and at every index: a fixed noisy dataset over the procedural stream. The wrong label
is the true value off by one, ``(gold ± 1) mod modulus`` (sign drawn per problem): plausible, never the gold.
The corrupted set at a smaller rate is a subset of that at a larger one. Only ``answer`` changes
(``meta["clean_answer"]`` keeps the gold; the reference trace and ``meta["xs"/"ops"]`` stay clean), held-out
problems are never corrupted, and the warm start's SFT traces are drawn from clean problems, so the warm start
does not depend on ``label_noise`` (the field is left out of its cache key).
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from collections.abc import Iterator, Sequence

from groupwise.seeding import stable_seed
from groupwise.tasks import TASKS
from groupwise.types import Problem

MODES = ("<NT>", "<SH>", "<LG>")
FILLERS = ("well ", "ok ", "note ", "hmm ")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_FORMAT = re.compile(r"(<NT>|<SH>|<LG>)?(<think>[^<]*</think>)?<answer>[^<]+</answer>")
_RESULT = re.compile(r"=(\d+);")
_RETRACTED = re.compile(r"[^;]*=\d+;wait ")  # a step that ``wait`` retracts (p_fix)
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabConfig:
    ops: str = "+-"
    """Allowed operations, a subset of '+-*'."""
    modulus: int = 10
    min_steps: int = 2
    max_steps: int = 4
    test_size: int = 256
    p_slip: float = 0.0
    p_wrap_slip: float = 0.0
    p_fix: float = 0.0
    p_drift: float = 0.0
    max_checks: int = 0
    check_correct_bonus: int = 0
    modes: bool = False
    env_latency_s: float = 0.0
    p_filler: float = 0.0
    p_early_exit: float = 0.0
    """Share of warm-start examples that stop thinking after a random number of clean steps and answer with the
    true result (``<think>3+5=8;</think><answer>3</answer>``), so the model's probability of the gold answer
    after a prefix is a value estimate (RREDCoT's acceptance setting)."""
    privileged_frac: float = 0.0
    """Share of warm-start examples shown with a privileged context (the problem plus its clean reference
    trace, ``teachers.PRIVILEGED_CONTEXT``) whose target is that clean trace: the warm-started model then
    knows how to use a verified solution, so a privileged teacher knows more than the flawed student."""
    sft_max_steps: int = 0
    """Longest chain among the warm start's SFT examples (0: ``max_steps``). Below ``max_steps`` the chains of
    ``sft_max_steps + 1`` to ``max_steps`` operations are first seen in RL: a length-generalisation gap (the
    headroom lab's third setting, ``recipes/headroom_unseen_lab.yaml``)."""
    label_noise: float = dataclasses.field(default=0.0, metadata={"warm_start": False})
    """Share of training problems whose gold answer is corrupted to ``(gold ± 1) mod modulus``, in [0, 1) (see
    the module docstring); held-out problems and the warm start stay clean."""

    def __post_init__(self) -> None:
        if not self.ops or set(self.ops) - set(_OPS):
            raise ValueError(f"ops={self.ops!r}: use a non-empty subset of '+-*'")
        if not 2 <= self.modulus <= 10:
            raise ValueError(f"modulus={self.modulus}: allowed 2..10 (single-digit values)")
        if not 1 <= self.min_steps <= self.max_steps <= 12:
            raise ValueError(f"min_steps={self.min_steps}, max_steps={self.max_steps}: need 1 <= min <= max <= 12")
        for f in ("p_slip", "p_wrap_slip", "p_fix", "p_drift", "p_filler", "p_early_exit", "privileged_frac"):
            if not 0.0 <= getattr(self, f) <= 1.0:
                raise ValueError(f"{f}={getattr(self, f)}: a probability in [0, 1]")
        if not 0.0 <= self.label_noise < 1.0:
            raise ValueError(f"label_noise={self.label_noise}: allowed [0, 1) (the share of training problems whose "
                             "gold answer is corrupted)")
        if self.sft_max_steps and not self.min_steps <= self.sft_max_steps <= self.max_steps:
            raise ValueError(f"sft_max_steps={self.sft_max_steps}: allowed 0 (= max_steps) or min_steps.."
                             f"max_steps ({self.min_steps}..{self.max_steps})")
        if self.max_checks < 0 or self.check_correct_bonus < 0 or self.test_size < 1 or self.env_latency_s < 0:
            raise ValueError("max_checks, check_correct_bonus, env_latency_s must be >= 0 and test_size >= 1")


class _Procedural(Sequence[Problem]):
    """A lazily generated, deterministic sequence: item i is always the same problem."""

    def __init__(self, n: int, make):
        self._n, self._make = n, make

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._make(j) for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._make(i % self._n)

    def __iter__(self) -> Iterator[Problem]:
        return (self._make(i) for i in range(self._n))


class Lab:
    """The reasoning-lab task (see the module docstring)."""

    name = "lab"

    def __init__(self, cfg: LabConfig, seed: int = 0):
        self.cfg = cfg
        self.seed = seed
        ks = list(range(cfg.min_steps, cfg.max_steps + 1))
        self.test = [self._problem("test", i, rng=random.Random(stable_seed("lab-test", i)),
                                   k=ks[i % len(ks)]) for i in range(cfg.test_size)]
        self._test_keys = {p.prompt for p in self.test}
        self.train = _Procedural(2**40, self._train_item)

    # ---------------------------------------------------------------------------------- problems
    def _train_item(self, i: int) -> Problem:
        p = self._clean_item(i)
        return self._corrupt(p) if self.cfg.label_noise else p

    def _clean_item(self, i: int) -> Problem:
        rng = random.Random(stable_seed("lab-train", self.seed, i))
        while True:  # held-out problems never appear in training
            p = self._problem("train", i, rng)
            if p.prompt not in self._test_keys:
                return p

    def _corrupt(self, p: Problem) -> Problem:
        """``p`` with its gold answer off by one, on the ``label_noise`` share of prompts (fixed per prompt)."""
        rng = random.Random(stable_seed("lab-label-noise", p.prompt))
        if rng.random() >= self.cfg.label_noise:
            return p
        wrong = (int(p.answer) + rng.choice((-1, 1))) % self.cfg.modulus
        return dataclasses.replace(p, answer=str(wrong), meta={**p.meta, "clean_answer": p.answer})

    def _problem(self, split: str, i: int, rng: random.Random, k: int | None = None) -> Problem:
        c = self.cfg
        k = k if k is not None else rng.randint(c.min_steps, c.max_steps)
        xs = [rng.randrange(c.modulus) for _ in range(k + 1)]
        ops = [rng.choice(c.ops) for _ in range(k)]
        text = str(xs[0]) + "".join(f"{o}{x}" for o, x in zip(ops, xs[1:]))
        values = self._values(xs, ops)
        return Problem(id=f"lab/{split}/{i}", prompt=text, answer=str(values[-1]), difficulty=k,
                       reference=self._long(xs, ops, values, checks=0),
                       meta={"xs": tuple(xs), "ops": tuple(ops)})

    def _values(self, xs: list[int], ops: list[str]) -> list[int]:
        acc, out = xs[0], []
        for o, x in zip(ops, xs[1:]):
            acc = _OPS[o](acc, x) % self.cfg.modulus
            out.append(acc)
        return out

    # ------------------------------------------------------------------------------------ traces
    @staticmethod
    def _long(xs, ops, values, checks: int) -> str:
        steps = "".join(f"{a}{o}{x}={v};" for a, o, x, v in zip([xs[0], *values], ops, xs[1:], values))
        last = f"{values[-2] if len(values) > 1 else xs[0]}{ops[-1]}{xs[-1]}={values[-1]};"
        return f"<think>{steps}so {values[-1]}.{('chk ' + last) * checks}</think><answer>{values[-1]}</answer>"

    def trace(self, problem: Problem, rng: random.Random, mode: str = "<LG>") -> str:
        """A warm-start completion for ``problem`` with the configured pathologies sampled from ``rng``."""
        c = self.cfg
        xs, ops = list(problem.meta["xs"]), list(problem.meta["ops"])
        if mode == "<NT>":
            return f"<NT><answer>{problem.answer}</answer>" if c.modes else f"<answer>{problem.answer}</answer>"
        if mode == "<SH>":  # two operations per step
            acc, parts, i = xs[0], [], 0
            while i < len(ops):
                n = 2 if i + 1 < len(ops) else 1
                expr = f"{acc}" + "".join(f"{ops[i + j]}{xs[i + j + 1]}" for j in range(n))
                for j in range(n):
                    acc = _OPS[ops[i + j]](acc, xs[i + j + 1]) % c.modulus
                parts.append(f"{expr}={acc};")
                i += n
            return f"<SH><think>{''.join(parts)}so {acc}.</think><answer>{acc}</answer>"
        acc, parts, last = xs[0], [], ""
        for o, x in zip(ops, xs[1:]):
            exact = _OPS[o](acc, x)
            v = exact % c.modulus
            wrong = lambda v=v: rng.choice([u for u in range(c.modulus) if u != v])  # noqa: E731
            if rng.random() < c.p_slip:
                v = wrong()
            elif exact != v and rng.random() < c.p_wrap_slip:
                v = (v + 1) % c.modulus
            elif rng.random() < c.p_fix:
                parts.append(f"{acc}{o}{x}={wrong()};wait ")
            last = f"{acc}{o}{x}={v};"
            parts.append(last)
            acc = v
        body = "".join(parts) + f"so {acc}."
        if str(acc) == problem.answer and rng.random() < c.p_drift:
            acc = rng.choice([u for u in range(c.modulus) if u != acc])
            body += f"wait {last.split('=')[0]}={acc};so {acc}."
            last = f"{last.split('=')[0]}={acc};"
        if c.p_filler and rng.random() < c.p_filler:  # no draw at 0: the other pathologies keep their stream
            body += "".join(rng.choice(FILLERS) for _ in range(rng.randint(1, 3)))
        bonus = c.check_correct_bonus if str(acc) == problem.answer else 0
        body += ("chk " + last) * rng.randint(0, c.max_checks + bonus)
        tag = "<LG>" if c.modes else ""
        return f"{tag}<think>{body}</think><answer>{acc}</answer>"

    def sft_examples(self, rng: random.Random, n: int) -> list[tuple[Problem, str]]:
        from groupwise.teachers import PRIVILEGED_CONTEXT, privileged_problem

        out = []
        for _ in range(n):
            p = self._clean_item(rng.randrange(len(self.train)))  # the warm start never sees corrupted labels
            while self.cfg.sft_max_steps and p.difficulty > self.cfg.sft_max_steps:  # no draw when unset
                p = self._clean_item(rng.randrange(len(self.train)))
            if self.cfg.privileged_frac and rng.random() < self.cfg.privileged_frac:  # no draw at 0: same stream
                out.append((privileged_problem(p, PRIVILEGED_CONTEXT), p.reference))
                continue
            if self.cfg.p_early_exit and rng.random() < self.cfg.p_early_exit:
                out.append((p, self.early_exit(p, rng)))
                continue
            mode = rng.choice(MODES) if self.cfg.modes else "<LG>"
            out.append((p, self.trace(p, rng, mode)))
        return out

    @staticmethod
    def early_exit(problem: Problem, rng: random.Random) -> str:
        """The clean reference trace cut after 0..k−1 of its k steps, then the true answer."""
        steps = problem.reference.split("<think>", 1)[1].split("so ", 1)[0].split(";")[:-1]
        j = rng.randrange(len(steps))
        return f"<think>{''.join(x + ';' for x in steps[:j])}</think><answer>{problem.answer}</answer>"

    # ---------------------------------------------------------------------------------- verifier
    def extract_answer(self, completion: str) -> str | None:
        found = _ANSWER.findall(completion)
        return found[-1].strip() if found else None

    def verify(self, problem: Problem, completion: str) -> bool:
        if self.cfg.env_latency_s:
            time.sleep(self.cfg.env_latency_s)
        return self.extract_answer(completion) == problem.answer

    def format_ok(self, completion: str) -> bool:
        return _FORMAT.fullmatch(completion.strip()) is not None

    def step_credit(self, problem: Problem, completion: str) -> float:
        """Partial credit: the fraction of the chain's k running values (the clean chain's, whatever label the
        problem carries) that the completion writes at the right step, e.g. ``<think>3+5=8;8-2=5;5+7=2;`` on
        ``3+5-2+7`` (values 8, 6, 3) -> 1/3: an early slip also costs the steps computed from it, as in the
        spec's ToyArith "fraction of correct intermediate sums". Steps are the ``=v;`` results before the
        commitment ``so``; a step retracted by ``wait`` is dropped (its recomputation counts). Long-style traces
        only: an ``<NT>`` completion scores 0, and a ``<SH>`` step covers two operations, so its positions do not
        line up with the chain's (its score is not meaningful)."""
        body = completion.split("<think>", 1)[1] if "<think>" in completion else ""
        body = _RETRACTED.sub("", body.split("so ", 1)[0].split("</think>", 1)[0])
        written = [int(v) for v in _RESULT.findall(body)]
        values = self._values(list(problem.meta["xs"]), list(problem.meta["ops"]))
        return sum(w == v for w, v in zip(written, values)) / len(values)

    def canonical_state(self, problem: Problem, partial: str) -> tuple[int, int] | None:
        """The exact state a partial completion ending at a step boundary (``;``) has reached: (segments written,
        the last written result), e.g. ``<think>3+5=8;8-2=6;`` -> (2, 6); None mid-step. Only the problem's own
        chain is ever continued, so (index, running value) is all its future depends on (GraphPO's oracle)."""
        if not partial.endswith(";"):
            return None
        results = _RESULT.findall(partial)
        return (partial.count(";"), int(results[-1])) if results else None


@TASKS.register("lab", config=LabConfig, provides=("step_credit",))
def lab(cfg: LabConfig, env) -> Lab:
    return Lab(cfg, env.seed)
