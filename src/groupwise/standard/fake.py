"""The ``fake`` generator: scripted completions for unit tests (a real Generator, no model involved).

Row i of every call gets ``completions[(offset + i) % len]``, tokenized, with EOS appended, a constant
log-prob per token, and finish reason "stop" (or "length" when truncated at the cap).
"""

from __future__ import annotations

import dataclasses

from groupwise.lazy import torch
from groupwise.rollout import GENERATORS
from groupwise.rollout.base import Request, SamplingParams
from groupwise.types import Completion


@dataclasses.dataclass(frozen=True, kw_only=True)
class FakeConfig:
    completions: tuple[str, ...] = ("<think>1+1=2;so 2.</think><answer>2</answer>",)
    logprob: float = -1.0

    def __post_init__(self) -> None:
        if not self.completions:
            raise ValueError("completions must list at least one scripted text")


class FakeGenerator:
    def __init__(self, cfg: FakeConfig, tokenizer):
        self.cfg, self.tokenizer, self.calls = cfg, tokenizer, 0
        self._offset = 0

    def sync_weights(self, model) -> None:
        pass

    def generate(self, requests: list[Request], params: SamplingParams, rng: torch.Generator) -> list[Completion]:
        self.calls += 1
        out = []
        for r in requests:
            text = self.cfg.completions[self._offset % len(self.cfg.completions)]
            self._offset += 1
            ids = list(r.prefix) + self.tokenizer.encode(text, add_special_tokens=False)
            ids.append(self.tokenizer.eos_token_id)
            cap = r.max_tokens if r.max_tokens is not None else params.max_tokens
            reason = "stop" if len(ids) <= cap else "length"
            ids = torch.tensor(ids[:cap], dtype=torch.long)
            forced = torch.zeros_like(ids, dtype=torch.bool)
            forced[:len(r.prefix)] = True
            out.append(Completion(ids, torch.full(ids.shape, self.cfg.logprob), reason, forced))
        return out


# driver_only: its row counter is per process; logprobs=False: its log-prob is a scripted constant
@GENERATORS.register("fake", config=FakeConfig, driver_only=True, logprobs=False, snapshot=True)
def fake(cfg: FakeConfig, env) -> FakeGenerator:
    return FakeGenerator(cfg, env.tokenizer)
