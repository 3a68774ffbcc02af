"""``rouge_l``: ROUGE-L F1 of a completion against the problem's reference solution (LamPO's auxiliary reward).

From LambdaPO/LamPO (arXiv:2605.19416 / 2605.21235, both WITHDRAWN; specs §15): a dense "precision-recall
alignment with reference solutions", R_i = R_i^verify + α · ROUGE-L-F1(y_i, reference), α = 0.1 in the
spec (set this term's ``weight``). Off unless a recipe lists it. Scored with Google's ``rouge-score``
package (F-measure, β = 1, longest common subsequence; no stemming), imported when the term is built:
``pip install groupwise[rouge]``.

Units: ``words`` is the package's standard tokenizer (lower-cased alphanumeric words); ``chars`` scores
every non-space character, for texts without word boundaries (the lab's traces ``<think>3+5=8;...``, whose
operators the word tokenizer drops). The whole completion is compared with the whole reference; a problem
without a reference scores 0. Not gated on correctness (the spec's default).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from groupwise.rewards import REWARDS, per_sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class RougeLConfig:
    units: Literal["words", "chars"] = "words"


class CharTokenizer:
    """rouge-score tokenizer protocol: ``tokenize(text) -> list[str]``, one token per non-space character."""

    def tokenize(self, text: str) -> list[str]:
        return [c for c in text if not c.isspace()]


def scorer(units: str):
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise ImportError("reward 'rouge_l' needs rouge-score: pip install groupwise[rouge]") from None
    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=CharTokenizer() if units == "chars" else None)


@REWARDS.register("rouge_l", config=RougeLConfig)
def rouge_l(cfg: RougeLConfig, env):
    sc = scorer(cfg.units)
    return per_sample(lambda s, p: sc.score(p.reference, s.text)["rougeL"].fmeasure if p.reference else 0.0)
