"""``think_modes``: the group builder of adaptive think modes (arXiv:2608.20256, "Learning When to Think").

A completion starts with a mode tag m ∈ {<NT>, <SH>, <LG>} (NoThink / Short / Long): one token of the embedded
tokenizer (the lab task with ``modes: true`` writes them); several in a pretrained model's (SmolLM2 splits each
into ``<``, ``NT``, ``>``: the reasoning_gym task with ``modes: true`` writes them). A tag is the tokenizer's
encoding of its text (``mode_ids``); below, "the mode token" means all of its tokens. Each mode has a hard cap on
the tokens after the tag (EOS included). Together with the ``think_mode`` reward (mode-shaped R(m, c, L))
and the ``mode_balance`` advantage transform this is the paper's method; recipes/think_modes_lab.yaml.

  * Forced warm-up [paper]: for the first ``warmup_steps`` steps every group holds equal thirds of the
    allowed modes (counts differ by at most 1; which modes get the extra samples rotates with a draw from
    ``ctx.rng("think_modes")``), the mode token prefilled with ``loss_mask=False`` (its log-prob is not a
    policy choice; spec §2 design note); the content is trained normally.
  * After warm-up the policy samples the mode itself, in two phases: (1) as many tokens per row as the longest
    tag; (2) a row whose tokens start with a tag continues from that tag as a prefix with ``max_tokens = cap_m +
    len(tag)``, so the cap is enforced in generation (no wasted tokens past a cap; phase-1 tokens after a shorter
    tag are dropped and drawn again, the same law). The sampled tag is then trained: its ``loss_mask`` is set back
    to True and its ``rollout_logprobs`` to phase 1's sampling log-probs.
  * Cap rule: a rollout that its mode's cap cut off (``finish_reason == "length"``) is graded incorrect
    (``meta["over_cap"] = True`` and ``Sample.disqualified = "over_cap"``, so the reward stage grades it
    incorrect without calling the verifier; the ``think_mode`` reward gives 0).
    A rollout that ends with EOS exactly at the cap is within it.
  * Format failure: a completion that does not start with an allowed tag ends the rollout after phase 1 (its
    sampled tokens, trained with the group's advantage so the policy unlearns them); ``meta["mode"] = "invalid"``,
    reward 0 from ``think_mode``, counted in ``rollout/mode_invalid_frac``. Generating the rest would cost tokens
    whose reward is fixed at 0.
  * One allowed mode: nothing to choose, so the mode token is always forced; with ``mode_balance`` β = 0
    this is plain GRPO on that mode (tests/unit/rollout/test_think_modes.py).

Per sample: ``meta["mode"]`` ("<NT>" | "<SH>" | "<LG>" | "invalid"), ``meta["mode_len"]`` (the tag's tokens; 0
when invalid), ``meta["mode_cap"]``, ``meta["over_cap"]``, ``meta["mode_forced"]``. Metrics:
``rollout/mode_share_{NT,SH,LG}``, ``rollout/mode_invalid_frac``, ``rollout/mode_over_cap_frac``,
``rollout/mode_entropy`` (of the shares, nats), ``rollout/mode_acc_{m}``, ``rollout/mode_forced``. Deviations:
caps are tokens (the paper: 1,024 / 3,000 / global at 1.5B scale; scaled to the lab in the recipe). The spec's
optional ``mode_token_loss_weight`` is the credit component
``mode_token_weight`` (``mode_token_weight.py`` here), off by default (recipes/think_modes_mode_weight_lab.yaml).
"""

from __future__ import annotations

import dataclasses
import math

from groupwise.lazy import torch
from groupwise.rollout import BUILDERS
from groupwise.rollout.base import RolloutContext
from groupwise.types import Group, Problem, Sample

MODES = ("<NT>", "<SH>", "<LG>")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThinkModesConfig:
    modes: tuple[str, ...] = MODES
    """Allowed modes, a subset of <NT>, <SH>, <LG>; one mode = always forced (the neutral setting)."""
    cap_nt: int = 8
    """Max tokens after <NT> (EOS included). The mode tag itself counts toward rollout.max_completion_tokens."""
    cap_sh: int = 40
    cap_lg: int = 0
    """0 means the global cap, rollout.max_completion_tokens − tag_tokens (Long is uncapped in the paper)."""
    warmup_steps: int = 45
    """Steps with forced equal thirds of the modes (the paper: 45 of its run)."""
    tag_tokens: int = 1
    """Tokens of the longest tag in the model's tokenizer (1 for the embedded one, 3 for SmolLM2's): the global
    cap of Long is rollout.max_completion_tokens − tag_tokens, and ``check`` bounds every cap by it (the tokenizer
    is not loaded at config time; the builder raises if a tag is longer)."""

    def __post_init__(self) -> None:
        if not self.modes or len(set(self.modes)) != len(self.modes) or set(self.modes) - set(MODES):
            raise ValueError(f"modes={list(self.modes)}: a non-empty subset of {', '.join(MODES)} without repeats")
        if self.cap_nt < 1 or self.cap_sh < 1 or self.cap_lg < 0 or self.warmup_steps < 0 or self.tag_tokens < 1:
            raise ValueError("cap_nt and cap_sh must be >= 1, cap_lg >= 0 (0: global cap), warmup_steps >= 0, "
                             "tag_tokens >= 1")
        if not self.cap_nt < self.cap_sh or (self.cap_lg and not self.cap_sh < self.cap_lg):
            raise ValueError(f"caps must increase strictly NT < SH < LG, got {self.cap_nt}, {self.cap_sh}, "
                             f"{self.cap_lg or 'global'}")

    def caps(self, max_completion_tokens: int) -> dict[str, int]:
        long = self.cap_lg or max_completion_tokens - self.tag_tokens
        return {"<NT>": self.cap_nt, "<SH>": self.cap_sh, "<LG>": long}

    def check(self, run) -> None:
        if not getattr(run.task.cfg, "modes", False):
            raise ValueError(f"needs a task that writes mode tokens (task '{run.task.name}' with modes: true)")
        limit = run.rollout.max_completion_tokens - self.tag_tokens
        caps = {m: c for m, c in self.caps(run.rollout.max_completion_tokens).items() if m in self.modes}  # used caps
        if max(caps.values()) > limit or not caps.get("<SH>", 0) < caps.get("<LG>", math.inf):
            raise ValueError(f"caps {caps} must increase strictly and not exceed rollout.max_completion_tokens − "
                             f"tag_tokens = {limit} (the mode tag counts toward it)")


def mode_ids(tokenizer, modes, tag_tokens: int) -> dict[str, tuple[int, ...]]:
    """Each tag's token ids (its encoding without special tokens), checked: it decodes back to the tag (so no tag's
    ids start another's: a completion's tag is read unambiguously) and is at most ``tag_tokens`` long."""
    ids = {m: tuple(int(t) for t in tokenizer.encode(m, add_special_tokens=False)) for m in modes}
    for m, t in ids.items():
        if not t or tokenizer.decode(list(t)) != m:
            raise ValueError(f"think_modes: tag {m} does not round-trip through the tokenizer (ids {list(t)})")
        if len(t) > tag_tokens:
            raise ValueError(f"think_modes: tag {m} is {len(t)} tokens in this tokenizer; set "
                             f"rollout.builder.tag_tokens={max(len(v) for v in ids.values())}")
    return ids


def read_mode(completion_ids, ids: dict[str, tuple[int, ...]]) -> str:
    """The tag a completion starts with, or "invalid"."""
    head = tuple(int(t) for t in completion_ids[:max(len(t) for t in ids.values())])
    return next((m for m, t in ids.items() if head[:len(t)] == t), "invalid")


class ThinkModes:
    def __init__(self, cfg: ThinkModesConfig):
        self.cfg = cfg
        self._step = -1
        self._seen: list[Sample] = []
        self._forced = False

    def __call__(self, problems: list[Problem], ctx: RolloutContext) -> list[Group]:
        cfg, g = self.cfg, ctx.group_size
        caps = cfg.caps(ctx.params.max_tokens)
        ids = mode_ids(ctx.tokenizer, cfg.modes, cfg.tag_tokens)
        forced = ctx.step < cfg.warmup_steps or len(cfg.modes) == 1
        if forced:  # equal shares, rotated per group so no mode always gets the extra samples
            start = torch.randint(len(cfg.modes), (len(problems),), generator=ctx.rng("think_modes")).tolist()
            chosen = [[cfg.modes[(start[i] + j) % len(cfg.modes)] for j in range(g)] for i in range(len(problems))]
            groups = ctx.sample_groups(problems, prefixes=[[list(ids[m]) for m in row] for row in chosen],
                                       max_tokens=[[caps[m] + len(ids[m]) for m in row] for row in chosen])
        else:
            groups = self._two_phase(problems, ctx, ids, caps)
        for grp in groups:
            for s in grp.samples:
                mode = read_mode(s.completion_ids[:s.length], ids)
                s.meta.update(mode=mode, mode_len=len(ids.get(mode, ())), mode_forced=forced,
                              mode_cap=caps.get(mode, 0), over_cap=mode != "invalid" and s.finish_reason == "length")
                if s.meta["over_cap"]:
                    s.disqualified = "over_cap"  # exceeding the mode's cap grades incorrect (not verified)
        if ctx.step != self._step:  # statistics cover every call of one step (refills included)
            self._step, self._seen = ctx.step, []
        self._seen += [s for grp in groups for s in grp.samples]  # read in metrics(), after the loop scored them
        self._forced = forced
        return groups

    def _two_phase(self, problems, ctx: RolloutContext, ids: dict[str, tuple[int, ...]],
                   caps: dict[str, int]) -> list[Group]:
        width = max(len(t) for t in ids.values())
        first = ctx.sample_groups(problems, max_tokens=[[width] * ctx.group_size for _ in problems],
                                  stage="think_modes/mode")
        mode = [[read_mode(s.completion_ids[:s.length], ids) for s in grp.samples] for grp in first]
        # invalid rows get a 1-token request on their first token (their phase-2 output is discarded: the phase-1
        # sample is kept)
        prefixes = [[list(ids[m]) if m in ids else [int(s.completion_ids[0])] for m, s in zip(row, grp.samples)]
                    for row, grp in zip(mode, first)]
        groups = ctx.sample_groups(problems, prefixes=prefixes,
                                   max_tokens=[[caps[m] + len(ids[m]) if m in ids else 1 for m in row] for row in mode])
        for grp, grp1, row in zip(groups, first, mode):
            for j, m in enumerate(row):
                if m not in ids:
                    grp.samples[j] = grp1.samples[j]
                    continue
                s, s1, n = grp.samples[j], grp1.samples[j], len(ids[m])
                s.loss_mask = s.loss_mask.clone()
                s.loss_mask[:n] = True  # the policy chose this tag: train it
                s.rollout_logprobs = s.rollout_logprobs.clone()
                s.rollout_logprobs[:n] = s1.rollout_logprobs[:n]
        return groups

    def metrics(self) -> dict[str, float]:
        c: dict[str, float] = {}
        for s in self._seen:
            m = s.meta["mode"]
            c[m] = c.get(m, 0.0) + 1
            c[f"acc{m}"] = c.get(f"acc{m}", 0.0) + s.correct
            c["over_cap"] = c.get("over_cap", 0.0) + s.meta["over_cap"]
        n = float(len(self._seen))
        if not n:
            return {}
        shares = {m: c.get(m, 0.0) / n for m in MODES}
        out = {f"rollout/mode_share_{m[1:-1]}": v for m, v in shares.items()}
        out.update({f"rollout/mode_acc_{m[1:-1]}": c[f"acc{m}"] / c[m] for m in MODES if c.get(m)})
        out["rollout/mode_invalid_frac"] = c.get("invalid", 0.0) / n
        out["rollout/mode_over_cap_frac"] = c["over_cap"] / n
        out["rollout/mode_entropy"] = -sum(p * math.log(p) for p in shares.values() if p > 0)
        out["rollout/mode_forced"] = float(self._forced)
        return out


@BUILDERS.register("think_modes", config=ThinkModesConfig, reports=True, provides=("think_modes",))
def think_modes(cfg: ThinkModesConfig, env) -> ThinkModes:
    return ThinkModes(cfg)
