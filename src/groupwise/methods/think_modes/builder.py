"""``think_modes``: the group builder of adaptive think modes (arXiv:2608.20256, "Learning When to Think").

The first completion token is a mode token m ∈ {<NT>, <SH>, <LG>} (NoThink / Short / Long; single tokens of
the embedded tokenizer, the lab task with ``modes: true`` writes them), and each mode has a hard cap on the
tokens after the mode token (EOS included). Together with the ``think_mode`` reward (mode-shaped R(m, c, L))
and the ``mode_balance`` advantage transform this is the paper's method; recipes/think_modes_lab.yaml.

  * Forced warm-up [paper]: for the first ``warmup_steps`` steps every group holds equal thirds of the
    allowed modes (counts differ by at most 1; which modes get the extra samples rotates with a draw from
    ``ctx.rng("think_modes")``), the mode token prefilled with ``loss_mask=False`` (its log-prob is not a
    policy choice; spec §2 design note); the content is trained normally.
  * After warm-up the policy samples the mode itself, in two phases: (1) one token per row; (2) the row
    continues from that token as a prefix with ``max_tokens = cap_m + 1``, so the cap is enforced in
    generation (no wasted tokens past a cap). The sampled mode token is then trained: its ``loss_mask`` is
    set back to True and its ``rollout_logprobs`` to phase 1's sampling log-prob.
  * Cap rule: a rollout that its mode's cap cut off (``finish_reason == "length"``) is graded incorrect
    (``meta["over_cap"] = True`` and ``Sample.disqualified = "over_cap"``, so the reward stage grades it
    incorrect without calling the verifier; the ``think_mode`` reward gives 0).
    A rollout that ends with EOS exactly at the cap is within it.
  * Format failure: a first token that is not an allowed mode ends the rollout there (one sampled token,
    trained with the group's advantage so the policy unlearns it); ``meta["mode"] = "invalid"``, reward 0
    from ``think_mode``, counted in ``rollout/mode_invalid_frac``. Generating the rest would cost tokens whose
    reward is fixed at 0.
  * One allowed mode: nothing to choose, so the mode token is always forced; with ``mode_balance`` β = 0
    this is plain GRPO on that mode (tests/unit/rollout/test_think_modes.py).

Per sample: ``meta["mode"]`` ("<NT>" | "<SH>" | "<LG>" | "invalid"), ``meta["mode_cap"]``, ``meta["over_cap"]``,
``meta["mode_forced"]``. Metrics: ``rollout/mode_share_{NT,SH,LG}``, ``rollout/mode_invalid_frac``,
``rollout/mode_over_cap_frac``, ``rollout/mode_entropy`` (of the shares, nats), ``rollout/mode_acc_{m}``,
``rollout/mode_forced``. Deviations: caps are tokens (the paper: 1,024 / 3,000 / global at 1.5B scale;
scaled to the lab in the recipe). The spec's optional ``mode_token_loss_weight`` is the credit component
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
    """Max tokens after <NT> (EOS included). The mode token itself counts toward rollout.max_completion_tokens."""
    cap_sh: int = 40
    cap_lg: int = 0
    """0 means the global cap, rollout.max_completion_tokens − 1 (Long is uncapped in the paper)."""
    warmup_steps: int = 45
    """Steps with forced equal thirds of the modes (the paper: 45 of its run)."""

    def __post_init__(self) -> None:
        if not self.modes or len(set(self.modes)) != len(self.modes) or set(self.modes) - set(MODES):
            raise ValueError(f"modes={list(self.modes)}: a non-empty subset of {', '.join(MODES)} without repeats")
        if self.cap_nt < 1 or self.cap_sh < 1 or self.cap_lg < 0 or self.warmup_steps < 0:
            raise ValueError("cap_nt and cap_sh must be >= 1, cap_lg >= 0 (0: global cap), warmup_steps >= 0")
        if not self.cap_nt < self.cap_sh or (self.cap_lg and not self.cap_sh < self.cap_lg):
            raise ValueError(f"caps must increase strictly NT < SH < LG, got {self.cap_nt}, {self.cap_sh}, "
                             f"{self.cap_lg or 'global'}")

    def caps(self, max_completion_tokens: int) -> dict[str, int]:
        return {"<NT>": self.cap_nt, "<SH>": self.cap_sh, "<LG>": self.cap_lg or max_completion_tokens - 1}

    def check(self, run) -> None:
        if not getattr(run.task.cfg, "modes", False):
            raise ValueError(f"needs a task that writes mode tokens (task '{run.task.name}' with modes: true)")
        limit = run.rollout.max_completion_tokens - 1
        caps = {m: c for m, c in self.caps(run.rollout.max_completion_tokens).items() if m in self.modes}  # used caps
        if max(caps.values()) > limit or not caps.get("<SH>", 0) < caps.get("<LG>", math.inf):
            raise ValueError(f"caps {caps} must increase strictly and not exceed rollout.max_completion_tokens − 1 "
                             f"= {limit} (the mode token counts toward it)")


class ThinkModes:
    def __init__(self, cfg: ThinkModesConfig):
        self.cfg = cfg
        self._step = -1
        self._seen: list[Sample] = []
        self._forced = False

    def __call__(self, problems: list[Problem], ctx: RolloutContext) -> list[Group]:
        cfg, g = self.cfg, ctx.group_size
        caps = cfg.caps(ctx.params.max_tokens)
        ids = {m: int(ctx.tokenizer.convert_tokens_to_ids(m)) for m in cfg.modes}
        forced = ctx.step < cfg.warmup_steps or len(cfg.modes) == 1
        if forced:  # equal shares, rotated per group so no mode always gets the extra samples
            start = torch.randint(len(cfg.modes), (len(problems),), generator=ctx.rng("think_modes")).tolist()
            chosen = [[cfg.modes[(start[i] + j) % len(cfg.modes)] for j in range(g)] for i in range(len(problems))]
            groups = ctx.sample_groups(problems, prefixes=[[[ids[m]] for m in row] for row in chosen],
                                       max_tokens=[[caps[m] + 1 for m in row] for row in chosen])
        else:
            groups = self._two_phase(problems, ctx, ids, caps)
        for grp in groups:
            for s in grp.samples:
                mode = next((m for m, t in ids.items() if s.length and int(s.completion_ids[0]) == t), "invalid")
                s.meta.update(mode=mode, mode_forced=forced, mode_cap=caps.get(mode, 0),
                              over_cap=mode != "invalid" and s.finish_reason == "length")
                if s.meta["over_cap"]:
                    s.disqualified = "over_cap"  # exceeding the mode's cap grades incorrect (not verified)
        if ctx.step != self._step:  # statistics cover every call of one step (refills included)
            self._step, self._seen = ctx.step, []
        self._seen += [s for grp in groups for s in grp.samples]  # read in metrics(), after the loop scored them
        self._forced = forced
        return groups

    def _two_phase(self, problems, ctx: RolloutContext, ids: dict[str, int], caps: dict[str, int]) -> list[Group]:
        first = ctx.sample_groups(problems, max_tokens=[[1] * ctx.group_size for _ in problems],
                                  stage="think_modes/mode")
        valid = set(ids.values())
        tok = [[int(s.completion_ids[0]) for s in grp.samples] for grp in first]
        mode_of = {t: m for m, t in ids.items()}
        # invalid rows get a 1-token request (their phase-2 output is discarded: the phase-1 sample is kept)
        groups = ctx.sample_groups(problems, prefixes=[[[t] for t in row] for row in tok],
                                   max_tokens=[[caps[mode_of[t]] + 1 if t in valid else 1 for t in row] for row in tok])
        for grp, grp1, row in zip(groups, first, tok):
            for j, t in enumerate(row):
                if t not in valid:
                    grp.samples[j] = grp1.samples[j]
                    continue
                s, s1 = grp.samples[j], grp1.samples[j]
                s.loss_mask = s.loss_mask.clone()
                s.loss_mask[0] = True  # the policy chose this mode token: train it
                s.rollout_logprobs = s.rollout_logprobs.clone()
                s.rollout_logprobs[0] = s1.rollout_logprobs[0]
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
