"""Teacher-forced log-probs of completions: the one forward used by training, warm start, replay and eval.

Layout (as in generation): prompts left-padded to a common width P, completions right-padded to T, so
every completion starts at column P and only the last T+1 logits are materialised (``logits_to_keep``).
Position ids count real tokens only, so padding never shifts a row's positions.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import TYPE_CHECKING, Any

from groupwise.adapters import base_model
from groupwise.lazy import torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass
class Packed:
    input_ids: Tensor  # [B, P+T]
    attention_mask: Tensor  # [B, P+T]
    position_ids: Tensor  # [B, P+T]
    completion_ids: Tensor  # [B, T]
    completion_mask: Tensor  # [B, T] bool: real (non-pad) completion tokens
    prompt_width: int


def pack(prompts: list[Tensor], completions: list[Tensor], pad_id: int, device: torch.device | str = "cpu") -> Packed:
    b = len(prompts)
    p = max(int(x.numel()) for x in prompts)
    t = max(max(int(x.numel()) for x in completions), 1)
    ids = torch.full((b, p + t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + t), dtype=torch.long)
    for i, (pr, co) in enumerate(zip(prompts, completions)):
        ids[i, p - pr.numel():p] = pr
        ids[i, p:p + co.numel()] = co
        attn[i, p - pr.numel():p + co.numel()] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    comp_mask = attn[:, p:].bool()
    return Packed(ids.to(device), attn.to(device), pos.to(device), ids[:, p:].to(device), comp_mask.to(device), p)


@dataclasses.dataclass
class Forward:
    """What one teacher-forced pass gives, completion-aligned: ``logprobs`` [B, T] of the sampled tokens (with
    grad if enabled), and on request ``entropy`` [B, T] (detached, full vocabulary), ``vocab_logprobs``
    [B, T, V] (the whole temperature-scaled log-softmax, with grad if enabled) and the model ``output``."""

    logprobs: Tensor
    entropy: Tensor | None = None
    vocab_logprobs: Tensor | None = None
    output: Any = None


def completion_logprobs(model: torch.nn.Module, packed: Packed, temperature: float = 1.0,
                        with_entropy: bool = False, output_attentions: bool = False,
                        with_vocab: bool = False) -> Forward:
    """Per-token log-probs of the packed completions (see ``Forward``).

    Logits are divided by ``temperature`` so that log-probs match the sampling distribution (TRL and verl do
    the same); no top-p / top-k truncation is applied. Padded positions hold 0.
    """
    t = packed.completion_ids.shape[1]
    out = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                position_ids=packed.position_ids, logits_to_keep=t + 1, use_cache=False,
                output_attentions=output_attentions)
    # position P-1+j predicts completion token j
    fwd = _from_logits([out.logits[:, :-1]], packed, temperature, with_entropy, with_vocab)
    fwd.output = out
    return fwd


def shared_prefix_logprobs(model: torch.nn.Module, packed: Packed, prompts: list[Tensor], pad_id: int,
                           temperature: float = 1.0, with_entropy: bool = False, with_vocab: bool = False,
                           common: bool = True) -> Forward:
    """``completion_logprobs`` with each distinct prompt computed once: its forward (and, through the cache it
    leaves, its share of the backward) runs once for all the rows that share it, instead of once per row. The
    prompts are run left-padded with a cache, the cache is expanded to one row per completion (an index, so its
    gradient is the sum over the rows), and the completions run on top of it. Equal to the unshared pass up to
    float summation order (``tests/unit/update/test_shared_prefix.py``); ``packed`` gives the completion layout.
    ``common``: as ``prefill``'s (the prompts' common prefix once more; False: always exactly two model calls)."""
    dev = packed.input_ids.device
    cache, first, attn = prefill(model, prompts, pad_id, dev, common=common)
    t = packed.completion_ids.shape[1]
    comp_attn = packed.attention_mask[:, packed.prompt_width:]
    pos = attn.sum(-1, keepdim=True) + torch.arange(t, device=dev)
    rest = model(input_ids=packed.completion_ids, attention_mask=torch.cat([attn, comp_attn], dim=1),
                 position_ids=pos, use_cache=True, logits_to_keep=t, **{cache_keyword(model): cache})
    # the prompt's last logits predict completion token 0; completion position j predicts token j+1
    return _from_logits([first.unsqueeze(1), rest.logits[:, :-1]], packed, temperature, with_entropy, with_vocab)


def dropout_in_training(model: torch.nn.Module) -> str | None:
    """Where ``model`` drops activations out in training mode (a ``Dropout`` module with p > 0, e.g. a LoRA
    adapter's ``lora_dropout``; or a config field ``*dropout*`` / ``*pdrop*`` > 0, e.g. a Llama's
    ``attention_dropout`` or GPT-2's ``resid_pdrop``), or None. Under dropout ``shared_prefix_logprobs`` is not the
    unshared pass: the rows of a prompt share one dropout mask over it."""
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and m.p > 0:
            return f"{name} (p={m.p})"
    config = getattr(base_model(model), "config", None)
    fields = config.to_dict() if hasattr(config, "to_dict") else {}
    for key, v in fields.items():
        if ("dropout" in key or "pdrop" in key) and isinstance(v, float) and v > 0:
            return f"config.{key}={v}"
    return None


def prefill(model: torch.nn.Module, prompts: list[Tensor], pad_id: int, device,
            share: bool = True, common: bool = True) -> tuple[Any, Tensor, Tensor]:
    """One forward per distinct prompt (left-padded), its KV cache expanded to one row per prompt given (an index:
    differentiable, so under grad each distinct prompt's backward also runs once). Returns (cache, the last
    prompt position's logits [B, V], the attention mask [B, W]); ``shared_prefix_logprobs`` and the generator's
    model-forward decode use it (``prefill_distinct``: the same, not expanded)."""
    cache, logits, attn, row = prefill_distinct(model, prompts, pad_id, device, share, common)
    cache.batch_select_indices(row)  # one cache row per prompt given
    return cache, logits[row], attn[row]


def prefill_distinct(model: torch.nn.Module, prompts: list[Tensor], pad_id: int, device,
                     share: bool = True, common: bool = True) -> tuple[Any, Tensor, Tensor, Tensor]:
    """``prefill`` with its cache, logits [U, V] and mask [U, W] one row per distinct prompt, and ``row`` [B]: the
    row of each prompt given (the fused decode attends to each prompt's keys once for all its samples).
    ``share=False`` runs every prompt given, duplicates included (``rollout.generator.share_prefill``).

    ``common``: a token prefix that several distinct prompts start with (a system prompt, worked examples) runs
    once, as one row, and those prompts' remaining tokens run on top of its cache (expanded by an index, so its
    backward also runs once). Prompts that share a prefix are found by ``prefix_groups`` (prompts asked in several
    forms: one prefix a form); a prompt that shares none runs whole in the second call. The rows are then laid out
    ``[left padding | its group's prefix | left padding | rest of the prompt]``, the padding masked and the positions
    those of the whole prompt, so every later step sees what a plain prefill leaves, up to float summation order
    (``tests/unit/models/test_common_prefix.py``). Where no grouping saves token slots, one plain forward runs."""
    index: dict[Any, int] = {}  # prompt (or its position, unshared) -> its row in the forward
    uniq: list[Tensor] = []
    rows: list[int] = []
    for i, p in enumerate(prompts):
        key = tuple(p.tolist()) if share else i
        if key not in index:
            index[key] = len(uniq)
            uniq.append(p.cpu())
        rows.append(index[key])
    row = torch.tensor(rows, device=device)
    grouped = prefix_groups(uniq) if common and share and len(uniq) > 1 else None
    cache_kw: dict[str, Any] = {}
    head_attn = torch.zeros((len(uniq), 0), dtype=torch.long)
    starts = [0] * len(uniq)
    if grouped is not None:
        group, lengths = grouped
        width = max(lengths)
        ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(lengths), width), dtype=torch.long)
        for k, n in enumerate(lengths):
            first_u = group.index(k)
            ids[k, width - n:], attn[k, width - n:] = uniq[first_u][:n], 1
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        first = model(input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=positions.to(device),
                      use_cache=True, logits_to_keep=1)
        cache = first.get("cache") or first.get("past_key_values")
        cache.batch_select_indices(torch.tensor([max(k, 0) for k in group], device=device))
        cache_kw = {cache_keyword(model): cache}
        head_attn = torch.cat([attn, attn.new_zeros(1, width)])[group]  # group -1 (no prefix): the zero row
        starts = [lengths[k] if k >= 0 else 0 for k in group]
        uniq = [p[n:] for p, n in zip(uniq, starts)]
    width = max(len(p) for p in uniq)
    ids = torch.full((len(uniq), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(uniq), width), dtype=torch.long)
    for u, p in enumerate(uniq):
        ids[u, width - len(p):], attn[u, width - len(p):] = p, 1
    positions = torch.tensor(starts).unsqueeze(1) + (attn.cumsum(-1) - 1).clamp(min=0)
    attn = torch.cat([head_attn, attn], dim=1)
    out = model(input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=positions.to(device),
                use_cache=True, logits_to_keep=1, **cache_kw)
    return out.get("cache") or out.get("past_key_values"), out.logits[:, -1], attn.to(device), row


MIN_SHARED = 16  # tokens: a shorter shared prefix is not worth a row of its own


def prefix_groups(prompts: list[Tensor]) -> tuple[list[int], list[int]] | None:
    """Distinct prompts grouped by a shared token prefix, for ``prefill_distinct``: (each prompt's group, -1 for a
    prompt in none; each group's prefix length), or None where grouping would not save token slots. In sorted
    order, a prompt joins the group before it when the prefix they all share (leaving each prompt one token of its
    own: its last position's logits are the first prediction) is at least MIN_SHARED tokens and at least half of
    what the group shared before (a group's prefix does not collapse to a chat template's first tokens). Token
    slots: plain, one row per prompt at the longest prompt's width; grouped, a row per group at the longest
    prefix's width, then a row per prompt at the longest remainder's."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].tolist())
    groups: list[tuple[list[int], int]] = []  # (members, shared prefix)
    for i in order:
        if groups:
            members, n = groups[-1]
            joined = min(n, common_prefix_len([prompts[members[-1]], prompts[i]]))
            if joined >= MIN_SHARED and 2 * joined >= n:
                groups[-1] = (members + [i], joined)
                continue
        groups.append(([i], len(prompts[i]) - 1))
    shared = [(members, n) for members, n in groups if len(members) > 1]
    if not shared:
        return None
    group, lengths = [-1] * len(prompts), []
    for k, (members, n) in enumerate(shared):
        lengths.append(n)
        for i in members:
            group[i] = k
    rest = max(len(p) - (lengths[k] if k >= 0 else 0) for p, k in zip(prompts, group))
    if len(lengths) * max(lengths) + len(prompts) * rest >= len(prompts) * max(len(p) for p in prompts):
        return None
    return group, lengths


def common_prefix_len(prompts: list[Tensor]) -> int:
    """Tokens every prompt starts with, leaving each prompt at least one token of its own (its last position's
    logits are the first prediction)."""
    n = min(len(p) for p in prompts) - 1
    head = prompts[0]
    for p in prompts[1:]:
        if n <= 0:
            return 0
        same = head[:n] == p[:n]
        n = n if bool(same.all()) else int((~same).int().argmax())
    return max(n, 0)


def cache_keyword(model: torch.nn.Module) -> str:
    """The name of a model's KV-cache argument: transformers 5.x renamed it ``cache``; 4.x only knows
    ``past_key_values`` (a peft LoRA policy forwards its keyword arguments to the base model: ask the base)."""
    model = getattr(model, "lora_model", model)  # lora.BaseView: the policy with its adapter off
    return "cache" if "cache" in inspect.signature(base_model(model).forward).parameters else "past_key_values"


def _from_logits(parts: list[Tensor], packed: Packed, temperature: float, with_entropy: bool,
                 with_vocab: bool) -> Forward:
    """Completion-aligned logits, given as ``parts`` [B, t_i, V] that join along T into [B, T, V] (the shared-prefix
    pass has the prompt's last logits apart from the completion's: joining them would copy the whole tensor) -> the
    ``Forward`` of the sampled tokens, computed in fp32 whatever the logits' dtype (bf16 from a 16-bit model or under
    ``optim.autocast``: upcast before the log-softmax)."""
    mask = packed.completion_mask
    lengths = mask.sum(-1)
    if not bool((mask == (torch.arange(mask.shape[1], device=mask.device) < lengths.unsqueeze(1))).all()):
        lengths = torch.full_like(lengths, mask.shape[1])  # not a prefix of each row: every position, masked below
    lps, ents, at = [], [], 0
    for x in parts:
        t = x.shape[1]
        lp, ent = token_logprobs(x, packed.completion_ids[:, at:at + t], (lengths - at).clamp(0, t), temperature,
                                 with_entropy)
        lps.append(lp)
        ents.append(ent)
        at += t
    join = lambda xs: torch.cat(xs, dim=1) if len(xs) > 1 else xs[0]  # noqa: E731
    fwd = Forward(join(lps).masked_fill(~mask, 0.0))
    if with_entropy:
        fwd.entropy = join(ents).masked_fill(~mask, 0.0)
    if with_vocab:
        logits = join(parts).float()
        if temperature != 1.0:
            logits = logits / temperature
        fwd.vocab_logprobs = (logits - torch.logsumexp(logits, dim=-1, keepdim=True)).masked_fill(
            ~mask.unsqueeze(-1), 0.0)
    return fwd


def token_logprobs(logits: Tensor, ids: Tensor, lengths: Tensor, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """log softmax(logits / temperature)[ids] [B, T] in fp32, at each row's first ``lengths`` positions (0 beyond,
    and no gradient there), and with ``with_entropy`` the distribution's entropy there [B, T] (no gradient; else
    None). The same numbers as ``(x / t).gather(ids) - (x / t).logsumexp(-1)`` through autograd, gradient included,
    and as ``-(logp.exp() * logp).sum(-1)`` of the whole log-softmax (``tests/unit/models/test_token_logprobs.py``:
    bitwise in fp32), in less time and memory
    (docs/benchmarks.md, "Lever: the sampled tokens' log-probs"): it runs a few positions at a time (their [c, V]
    temporaries stay in cache), skips the padding, and its backward writes the gradient in one pass instead of
    materialising a zero tensor, a scatter and two [B, T, V] products. ``lengths`` [B]."""
    lp, ent = _token_logprobs_function().apply(logits, ids, lengths, float(temperature), with_entropy)
    return lp, (ent if with_entropy else None)


def _chunk(logits: Tensor) -> int:
    """Positions a step: on a CPU 32 ([32, 49152] fp32 is 6 MB, cache-sized temporaries); on an accelerator a whole
    row (one kernel each, not thousands of small ones)."""
    return 32 if logits.device.type == "cpu" else max(logits.shape[1], 1)


def _forward(ctx, logits: Tensor, ids: Tensor, lengths: Tensor, temperature: float,
             with_entropy: bool) -> tuple[Tensor, Tensor]:
    """``token_logprobs``' forward: the log-sum-exps kept for the backward, nothing [B, T, V]."""
    b, t, _ = logits.shape
    out = torch.zeros(b, t, device=logits.device)
    lse = torch.zeros(b, t, device=logits.device)
    ent = torch.zeros(b if with_entropy else 0, t, device=logits.device)
    c = _chunk(logits)
    for i, n in enumerate(lengths.tolist()):
        for s in range(0, n, c):
            e = min(s + c, n)
            z = _scaled(logits[i, s:e], temperature)
            lse[i, s:e] = torch.logsumexp(z, dim=-1)
            out[i, s:e] = z.gather(-1, ids[i, s:e, None]).squeeze(-1) - lse[i, s:e]
            if with_entropy:
                logp = z - lse[i, s:e, None]
                ent[i, s:e] = -(logp.exp() * logp).sum(-1)
    ctx.save_for_backward(logits, ids, lengths, lse)
    ctx.temperature = temperature
    ctx.mark_non_differentiable(ent)
    return out, ent


def _backward(ctx, grad: Tensor, _grad_entropy: Tensor):
    """``token_logprobs``' backward: the logits' gradient written once, 0 at the padding."""
    logits, ids, lengths, lse = ctx.saved_tensors
    temperature = ctx.temperature
    dx = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    c = _chunk(logits)
    for i, n in enumerate(lengths.tolist()):
        dx[i, n:].zero_()
        for s in range(0, n, c):
            e = min(s + c, n)
            g = grad[i, s:e, None]
            # d/dz (z[id] - logsumexp z) = onehot(id) - softmax(z), times the incoming gradient (autograd's order)
            d = (_scaled(logits[i, s:e], temperature) - lse[i, s:e, None]).exp_().mul_(-g)
            d.scatter_add_(-1, ids[i, s:e, None], g)
            dx[i, s:e] = d / temperature if temperature != 1.0 else d
    return dx, None, None, None, None


@functools.cache
def _token_logprobs_function() -> type:
    """``token_logprobs``' autograd Function, made on first use (a class statement here would import torch with the
    module, and ``groupwise config`` imports none)."""
    return type("TokenLogprobs", (torch.autograd.Function,),
                {"forward": staticmethod(_forward),
                 "backward": staticmethod(torch.autograd.function.once_differentiable(_backward))})


def _scaled(x: Tensor, temperature: float) -> Tensor:
    x = x.float()
    return x / temperature if temperature != 1.0 else x
