"""``opsd``: on-policy self-distillation, a per-token loss toward a (privileged) teacher on the student's samples.

OPSD (reference trainer github.com/siyan-zhao/OPSD; the baseline of DASH-OPSD arXiv:2608.06243 and RLCSD
arXiv:2606.11709): the student π_S = π_θ(·|x, y_<t) is matched, on its own sampled tokens y, to a teacher
π_T(·|c, y_<t) whose context c holds privileged information (``teachers/``; OPSD's teacher is the frozen
initial policy shown the problem plus its verified solution: ``teacher: {name: frozen, context: ...}``).

``support: vocab`` (the whole vocabulary) or ``topk`` (the teacher's k most likely tokens plus one tail bucket
holding the rest of each distribution's mass; the teacher's ``top_k``): with p = π_S, q = π_T per entry v,
  β = 0      e_v = q_v (log q_v − log p_v)                         forward KL(π_T ‖ π_S)
  β = 1      e_v = p_v (log p_v − log q_v)                         reverse KL(π_S ‖ π_T)
  0 < β < 1  e_v = β q_v (log q_v − log m_v) + (1 − β) p_v (log p_v − log m_v),  m = (1 − β) p + β q
  r_t = Σ_v min(e_v, τ)                                            (τ = ``token_clip``, 0.05)
The endpoints are the KL limits, not the mixture formula's (which is 0 at β = 0), as in the reference
trainer and TRL's ``generalized_jsd_loss``. The per-entry clip applies before the sum, so r_t may be negative
(the OPSD author confirmed this is intended); ``token_clip: .inf`` turns it off. ``support: sampled`` is the
sampled-token form, r_t = −sg(log q_y − log p_y) · log p_y, whose gradient is the reverse-KL policy gradient.

Reduction: the run's (``token_mean`` = the reference trainer's sum over valid (token, entry) pairs ÷ valid
tokens, but step-global; see docs/conventions.md). Both distributions are the temperature-scaled softmax at
``rollout.temperature`` over the full vocabulary (no top-p renormalisation; OPSD uses 1.1 in sampling and in
the loss). The term is not advantage-only: rows with zero advantage still carry loss.
Metrics: ``loss/opsd_div`` (mean r_t), ``loss/opsd_clip_frac`` (share of clipped entries).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import torch
from groupwise.losses import LOSSES, support_logprobs
from groupwise.losses.reduce import masked_sum_count
from groupwise.types import LossInputs, LossTerms

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class OPSDConfig:
    support: Literal["vocab", "topk", "sampled"] = "vocab"
    beta: float = 0.5
    """β of the mixture: 0 = forward KL(π_T‖π_S), 1 = reverse KL(π_S‖π_T); the OPSD scripts use 0.5."""
    token_clip: float = dataclasses.field(default=0.05, metadata={"infinite": True})  # .inf: no clip
    """τ: each vocabulary entry's contribution is clipped from above at τ before the sum (.inf: off)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta={self.beta}: the mixture weight must be in [0, 1]")
        if not self.token_clip > 0:
            raise ValueError(f"token_clip={self.token_clip}: must be > 0 (.inf turns the clip off)")


def needs(cfg: OPSDConfig) -> tuple[str, ...]:
    return {"vocab": ("teacher_vocab", "vocab"), "topk": ("teacher_topk", "vocab"), "sampled": ("teacher",)}[
        cfg.support]


def entry_divergence(lp: Tensor, lq: Tensor, beta: float) -> Tensor:
    """e_v per entry from student / teacher log-probs over the same support ([..., V])."""
    p, q = lp.exp(), lq.exp()
    if beta == 0.0:
        return q * (lq - lp)
    if beta == 1.0:
        return p * (lp - lq)
    lm = torch.logsumexp(torch.stack([lp + math.log(1 - beta), lq + math.log(beta)]), dim=0)
    return beta * q * (lq - lm) + (1 - beta) * p * (lp - lm)


def token_divergence(inp: LossInputs, cfg: OPSDConfig) -> tuple[Tensor, Tensor]:
    """(r_t [B, T] with grad through the student, clipped share of entries [B, T])."""
    if cfg.support == "sampled":
        assert inp.teacher is not None, "opsd: sampled support needs the teacher's log-probs"
        gap = (inp.teacher.logprobs - inp.logprobs).detach()
        return -gap * inp.logprobs, torch.zeros_like(gap)
    lp, lq = support_logprobs(inp, cfg.support)
    e = entry_divergence(lp, lq, cfg.beta)
    clipped = e > cfg.token_clip
    return torch.clamp(e, max=cfg.token_clip).sum(-1), clipped.float().mean(-1).detach()


@LOSSES.register("opsd", config=OPSDConfig, needs=needs)
def opsd(inp: LossInputs, cfg: OPSDConfig) -> LossTerms:
    r, clip = token_divergence(inp, cfg)
    m = inp.completion_mask
    return LossTerms(r, {"loss/opsd_div": masked_sum_count(r.detach(), m),
                         "loss/opsd_clip_frac": masked_sum_count(clip, m)})
