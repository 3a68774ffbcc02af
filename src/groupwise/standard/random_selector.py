"""``random``: shuffled epochs over a finite train split; i.i.d. draws from a procedural one.

Every draw derives from ``(seed, epoch)`` or ``(seed, step)``, and the cursor is checkpointed, so a
resumed run sees exactly the problems an uninterrupted run would.
"""

from __future__ import annotations

import random as _random

from groupwise.registry import NoConfig
from groupwise.seeding import stable_seed
from groupwise.select import SELECTORS
from groupwise.types import Problem

PROCEDURAL = 10**7  # above this many train items, draw i.i.d. instead of permuting


class RandomSelector:
    def __init__(self, task, seed: int):
        self.task, self.seed = task, seed
        self.epoch, self.cursor = 0, 0
        self._order: list[int] | None = None

    def _perm(self) -> list[int]:
        if self._order is None:
            self._order = list(range(len(self.task.train)))
            _random.Random(stable_seed("select", self.seed, self.epoch)).shuffle(self._order)
        return self._order

    def next(self, step: int, n: int, ctx=None) -> list[Problem]:
        train = self.task.train
        if len(train) > PROCEDURAL:
            rng = _random.Random(stable_seed("select", self.seed, step, self.cursor))
            self.cursor += n
            return [train[rng.randrange(len(train))] for _ in range(n)]
        out = []
        while len(out) < n:
            order = self._perm()
            take = order[self.cursor:self.cursor + n - len(out)]
            out += [train[i] for i in take]
            self.cursor += len(take)
            if self.cursor >= len(order):
                self.epoch, self.cursor, self._order = self.epoch + 1, 0, None
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor, self._order = state["epoch"], state["cursor"], None


@SELECTORS.register("random", config=NoConfig, stateful=True)
def random(cfg: NoConfig, env) -> RandomSelector:
    return RandomSelector(env.task, env.seed)
