"""The ``hf`` generator: batched sampling with any transformers causal LM and its KV cache.

Identical prompts share one prefill (the G samples of a group cost one prompt pass; the fused decode keeps its
keys once for the G rows, the model's own forward gets the cache expanded G-fold), prompts are left-padded, rows
stop on EOS, on a stop string or at their own cap, and finished rows are dropped from the cache so late steps only
compute live rows. It samples from the training model's own parameters, so weight sync is free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import no_grad, torch
from groupwise.models.forward import cache_keyword, prefill_distinct
from groupwise.registry import ConfigError
from groupwise.rollout import GENERATORS
from groupwise.rollout.base import Request, SamplingParams, eos_ids
from groupwise.standard import fused
from groupwise.types import Completion

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFConfig:
    max_batch_rows: int = 1024
    """Rows per generation pass; larger requests are split."""
    compact_below: float = 0.75
    """Drop finished rows from the KV cache once live rows fall below this share of the batch (0: never)."""
    share_prefill: bool = True
    """Identical prompts (a group's G samples) share one prefill forward; false prefills every row (the same
    tokens and log-probs up to float summation order; for measuring the saving, benchmarks/levers.py)."""
    share_common_prefix: bool = True
    """A token prefix that several prompts of a generate call start with (a system prompt, worked examples; one a
    prompt form when prompts come in several) is prefilled once for all of them (``forward.prefix_groups``; the same
    tokens and log-probs up to float summation order); false prefills it with every distinct prompt."""
    decode: Literal["auto", "model", "fused"] = "auto"
    """``fused``: Llama-family models (llama, mistral, qwen2, qwen3; a peft LoRA policy's adapter folded into the
    weights) decode with fused QKV and gate/up GEMMs and a preallocated KV buffer (``standard/fused.py``; equal
    to the model's decode up to float summation order); other models fall back to ``model``, with one warning
    naming the reason. ``model``: every decode step is the model's own forward with its ``DynamicCache``.
    ``auto``: ``fused`` where it runs, else ``model`` without a warning. The path a call took is the
    generator's ``decode_path``."""
    dtype: Literal["model", "bf16", "int8"] = "model"
    """``model``: the decode runs in the model's dtype (exact up to float summation order). ``bf16``: the fused
    decode's GEMMs (the LM head's too) and attention run in bfloat16 and its KV buffer is bfloat16, the
    residual stream, norms and rotary in float32 (``standard/fused.py``); the prefill is the model's own forward
    under ``torch.autocast`` to bfloat16 (1.3-1.7x faster than in float32 on the real model). Only
    the sampler changes: the model's parameters are not touched, the update stays float32. For CPUs with
    bfloat16 matmul units (AVX512-BF16 / AMX) or GPUs. The rollout log-probs are then the bf16 sampler's, off
    the trainer's float32 ones by the rounding (real model: mean |Δ log p| 0.009-0.021 per token, p99 0.12-0.13;
    ``mismatch/*`` logs it; decode 1.33-1.51x faster on an AVX512-BF16 CPU: docs/benchmarks.md), so
    pair it with ``loss.importance_sampling: {mode: token_truncate}`` (or ``sequence_truncate``); PPO's ratio is
    unaffected (π_old is the update's own forward), replayed rows' behaviour log-probs are the bf16 sampler's.
    Needs the fused decode: refused at build with ``decode: model`` or a model it does not cover (another model
    type, a non-float32 model, a head other than ``nn.Linear`` / plain LoRA); a length it cannot cover at
    generate time (a sliding window shorter than the sequence) decodes that call in float32 with one warning.
    ``int8`` (CPU only): the fused decode's GEMMs, the LM head's too, in int8 (fbgemm's dynamic linear: weights
    rounded per output row once per call, each GEMM's input rounded to 7 bits per call, smoothed by the input ranges
    the prefill records), all else float32 (the prefill, KV buffer and attention included). Decode 1.5-1.9x faster
    than ``model`` on SmolLM2 on an AVX512-VNNI CPU, at 4.5-30x bf16's mismatch (``mismatch/kl`` 3e-3 to 1.4e-2 a
    token; docs/benchmarks.md): pair it with ``loss.importance_sampling``; refused as ``bf16`` is, and on another
    device. In the one real-model run so far (the real-model lab, seed 0, with ``token_truncate``) GRPO learned less
    than with ``model``: held-out pass@1 -0.024 +- 0.012 against GRPO's run, its training reward flat
    (docs/benchmarks.md, "Lever: int8 generation")."""
    sampler: Literal["race", "multinomial"] = "race"
    """How a token is drawn from the temperature-scaled (top-p filtered) distribution: ``race``, the exponential
    race of ``sample_rows`` (float32 uniforms; ~3.6x cheaper than ``multinomial`` over a 49k vocabulary), or
    ``torch.multinomial``, the sampler of every run before 2026-12-06: the same law, other draws for one seed
    (set it to reproduce those runs token for token). Greedy decoding uses neither."""

    def __post_init__(self) -> None:
        if self.max_batch_rows < 1 or not 0 <= self.compact_below <= 1:
            raise ValueError("max_batch_rows must be >= 1 and compact_below in [0, 1]")
        if self.dtype != "model" and self.decode == "model":
            raise ValueError(f"dtype={self.dtype} runs in the fused decode; allowed: decode=auto or fused with "
                             f"dtype={self.dtype}")


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of tokens whose mass reaches ``top_p`` (always at least the top token)."""
    sorted_p, order = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass before this token already reached top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p)


def race(probs: Tensor, u: Tensor) -> Tensor:
    """The exponential race: row i's argmax of ``probs / E`` with ``E = -log(u)`` (``probs`` [A, V] non-negative,
    ``u`` [A, V] uniform in [0, 1)). With E ~ Exp(1) independent, token j wins with probability p_j / sum(p), the
    law ``torch.multinomial(probs, 1)`` draws by the same race. ``u`` is floored at float32's smallest normal
    (E <= 87.3), so every positive-mass token scores above 0 and a zero-mass one (score 0) never wins; ``u`` is
    overwritten."""
    return probs.div(u.clamp_min_(torch.finfo(torch.float32).tiny).log_().neg_()).argmax(-1)


def sample_rows(probs: Tensor, rng: torch.Generator) -> Tensor:
    """One token per row of ``probs`` [A, V]: ``torch.multinomial(probs, 1)``'s exponential race with E = -log(U),
    U a float32 uniform, at ~0.28 of its CPU time over SmolLM2's 49,152-token vocabulary (64 rows, one thread: 18.1
    against 65.2 ms per decode step, ``benchmarks/decode_paths.py --sampler-cost 49152``; multinomial draws E in
    double precision, which costs the rest). U's 2^-24 grid
    moves a token's probability by ~1e-7 at most, below the float32 logits' own rounding. The draws differ from
    ``multinomial``'s for one seed; their law does not (tests/unit/rollout/test_hf.py)."""
    return race(probs, torch.empty(probs.shape, dtype=torch.float32).uniform_(generator=rng))


class HFGenerator:
    def __init__(self, cfg: HFConfig, model: torch.nn.Module, tokenizer):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.eos_ids = torch.tensor(eos_ids(model, tokenizer), dtype=torch.long)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._cache_kw = cache_keyword(model)
        self._warned = False
        self._dtype = {"bf16": torch.bfloat16, "int8": torch.qint8}.get(cfg.dtype)  # the fused decode's GEMMs'
        self.decode_path = ""  # the decode path of the last generate call: fused (bf16 / int8), or model (and why)

    def sync_weights(self, model: torch.nn.Module) -> bool:
        """It samples from the trainer's own parameters: nothing to copy, nothing the sync check must probe
        (``Generator``). A variant that samples from a copy must return None here."""
        assert model is self.model
        return True

    @no_grad
    def generate(self, requests: list[Request], params: SamplingParams, rng: torch.Generator) -> list[Completion]:
        out: list[Completion] = []
        step = self.cfg.max_batch_rows
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(requests), step):
                out.extend(self._generate(requests[i:i + step], params, rng))
        finally:
            self.model.train(was_training)
        return out

    def _prefill(self, reqs: list[Request], low: bool):
        """One forward per distinct prompt (left-padded; their common prefix once): its cache, last logits [U, V]
        and mask [U, W] one row per distinct prompt, and each request's row [B]; ``low``: under autocast to
        ``dtype`` (the bf16 fused decode's prefill: its logits and cache in bfloat16)."""
        dev = next(self.model.parameters()).device
        with torch.autocast(dev.type, dtype=self._dtype) if low else contextlib.nullcontext():
            return prefill_distinct(self.model, [r.prompt_ids for r in reqs], self.pad_id, dev,
                                    self.cfg.share_prefill, self.cfg.share_common_prefix)

    def _start(self, reqs: list[Request], is_fused: bool, steps: int):
        """The prefill's (logits [B, V], next positions [B]) and the decoder that continues from its cache: the
        fused one keeps each prompt's keys once (``fused.KV``), the model's own forward gets them copied into
        every request's row. The int8 fused decoder gets the prefill's GEMM input ranges (``fused.ActRanges``) for
        its smoothing."""
        ranges = fused.ActRanges(self.model) if is_fused and self._dtype == torch.qint8 else contextlib.nullcontext()
        with ranges:
            cache, logits, attn, row = self._prefill(reqs, is_fused and self._dtype == torch.bfloat16)
        logits, next_pos = logits[row], attn.sum(-1)[row]
        if not is_fused:
            cache.batch_select_indices(row)
            return logits, next_pos, _ModelDecoder(self.model, cache, attn[row], self._cache_kw)
        return logits, next_pos, fused.FusedDecoder(self.model, cache, attn, steps, self._dtype,
                                                    getattr(ranges, "amax", None), row)

    def _pick(self, logits: Tensor, params: SamplingParams, rng: torch.Generator) -> tuple[Tensor, Tensor]:
        """(sampled or greedy token [A], the temperature-scaled log-softmax [A, V] it was drawn from)."""
        temp = params.temperature
        scaled = logits.float() / temp if temp > 0 and temp != 1.0 else logits.float()  # (x / 1 is x: no pass)
        lp = torch.log_softmax(scaled, dim=-1)  # [A, V]
        if temp <= 0:
            return lp.argmax(-1), lp
        probs = lp.exp()
        if params.top_p < 1.0:
            probs = top_p_filter(probs, params.top_p)
        if self.cfg.sampler == "multinomial":
            return torch.multinomial(probs.cpu(), 1, generator=rng).squeeze(-1).to(logits.device), lp
        return sample_rows(probs.cpu(), rng).to(logits.device), lp

    def fused_reason(self, length: int) -> str | None:
        """Why the fused decode (in ``dtype``) cannot run for ``length``-token sequences (None: it runs)."""
        return fused.unsupported(self.model, length, self._dtype)

    def _fused(self, length: int) -> bool:
        """Whether this call (``length``: its widest prompt plus its new tokens) decodes fused; sets
        ``decode_path``, and warns once where a fused decode that was asked for falls back."""
        asked = self.cfg.decode
        reason = self.fused_reason(length) if asked != "model" else "not asked"
        if reason is None:
            self.decode_path = "fused" if self._dtype is None else f"fused ({self.cfg.dtype})"
            return True
        self.decode_path = "model" if asked == "model" else f"model ({reason})"
        if (asked == "fused" or self._dtype is not None) and not self._warned:
            key = f"dtype: {self.cfg.dtype}" if self._dtype is not None else "decode: fused"
            warnings.warn(f"rollout.generator {key} falls back to the model's forward: {reason}", stacklevel=3)
            self._warned = True
        return False

    def _generate(self, reqs: list[Request], params: SamplingParams, rng: torch.Generator) -> list[Completion]:
        from groupwise.log import advance  # (here: loading a recipe that names this generator stays light)

        st = _Decode.start(reqs, params, self.pad_id)
        is_fused = self._fused(max(len(r.prompt_ids) for r in reqs) + st.steps)  # (the prefill's width)
        logits, next_pos, dec = self._start(reqs, is_fused, st.steps)
        eos = self.eos_ids.to(logits.device)
        for t in range(st.steps):
            tok, lp = self._pick(logits, params, rng)
            tok, done = st.record(t, tok, lp, eos)
            if params.stop:
                self._stop_strings(st, t, done, params.stop)
            live = int(st.live.sum())
            st.live = st.live & ~done & (st.length[st.rows] < st.caps[st.rows])
            advance(live - int(st.live.sum()))  # finished completions, for the run's screen (log.py)
            if not st.live.any():
                break
            if st.live.float().mean() < self.cfg.compact_below:  # shrink the cache to the live rows
                keep = torch.nonzero(st.live).flatten()
                dec.keep(keep.to(logits.device))
                st.rows, st.live, next_pos, tok = st.rows[keep], st.live[keep], next_pos[keep], tok[keep]
            logits = dec.step(tok, next_pos)
            next_pos = next_pos + 1
        return st.completions()

    def _stop_strings(self, st: _Decode, t: int, done: Tensor, stop: tuple[str, ...]) -> None:
        for i in torch.nonzero(st.live & ~done).flatten().tolist():
            r = int(st.rows[i])
            tail = self.tokenizer.decode(st.tokens[r, max(0, t - 24):t + 1].tolist(), skip_special_tokens=True)
            if any(tail.endswith(s) for s in stop):
                done[i], st.reason[r] = True, "stop"


class _ModelDecoder:
    """``decode: model``: each step is the model's own forward on its ``DynamicCache`` (the interface of
    ``fused.FusedDecoder``: ``keep`` drops finished rows, ``step`` feeds one token per row)."""

    def __init__(self, model: torch.nn.Module, cache, attn: Tensor, cache_kw: str):
        self.model, self.cache, self.attn, self.cache_kw = model, cache, attn, cache_kw

    def keep(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attn = self.attn[rows]

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        self.attn = torch.cat([self.attn, self.attn.new_ones(len(tok), 1)], dim=1)
        o = self.model(input_ids=tok.unsqueeze(-1), attention_mask=self.attn, position_ids=pos.unsqueeze(-1),
                       use_cache=True, **{self.cache_kw: self.cache})
        return o.logits[:, -1]


@dataclasses.dataclass
class _Decode:
    """The decode state of one generation call: outputs per request row, and which cache rows are live."""

    tokens: Tensor  # [B, steps]
    logps: Tensor  # [B, steps]
    forced: Tensor  # [B, steps] bool
    length: Tensor  # [B]
    reason: list[str]
    caps: Tensor  # [B] per-row token cap
    prefix: Tensor  # [B, n_pre] forced tokens, -1 where none
    rows: Tensor  # original index of each live cache row
    live: Tensor  # per cache row: still generating

    @property
    def steps(self) -> int:
        return self.tokens.shape[1]

    @staticmethod
    def start(reqs: list[Request], params: SamplingParams, pad_id: int) -> _Decode:
        b = len(reqs)
        caps = torch.tensor([r.max_tokens if r.max_tokens is not None else params.max_tokens for r in reqs])
        steps = int(caps.max())
        prefix = torch.full((b, max(max((len(r.prefix) for r in reqs), default=0), 1)), -1, dtype=torch.long)
        for i, r in enumerate(reqs):
            prefix[i, :len(r.prefix)] = torch.tensor(r.prefix, dtype=torch.long)
        return _Decode(torch.full((b, steps), pad_id, dtype=torch.long), torch.zeros((b, steps)),
                       torch.zeros((b, steps), dtype=torch.bool), torch.zeros(b, dtype=torch.long), ["length"] * b,
                       caps, prefix, torch.arange(b), torch.ones(b, dtype=torch.bool))

    def record(self, t: int, tok: Tensor, lp: Tensor, eos: Tensor) -> tuple[Tensor, Tensor]:
        """Apply forced prefixes at step t, write the live rows' tokens and log-probs; return (tok, done)."""
        if t < self.prefix.shape[1] and bool((self.prefix[:, t] >= 0).any()):
            f = self.prefix[self.rows, t].to(tok.device)
            is_forced = f >= 0
            tok = torch.where(is_forced, f, tok)
            self.forced[self.rows[self.live], t] = is_forced.cpu()[self.live]
        else:
            is_forced = torch.zeros_like(tok, dtype=torch.bool)
        tok_lp = lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        w = self.rows[self.live]
        self.tokens[w, t] = tok.cpu()[self.live]
        self.logps[w, t] = tok_lp.float().cpu()[self.live]
        self.length[w] += 1
        done = (torch.isin(tok, eos) & ~is_forced).cpu() & self.live
        for i in torch.nonzero(done).flatten().tolist():
            self.reason[self.rows[i]] = "stop"
        return tok, done

    def completions(self) -> list[Completion]:
        return [Completion(self.tokens[i, :self.length[i]].clone(), self.logps[i, :self.length[i]].clone(),
                           self.reason[i], self.forced[i, :self.length[i]].clone()) for i in range(len(self.reason))]


@GENERATORS.register("hf", config=HFConfig, snapshot=True)
def hf(cfg: HFConfig, env) -> HFGenerator:
    gen = HFGenerator(cfg, env.policy, env.tokenizer)
    reason, was = None, env.policy.training
    if cfg.dtype != "model":  # (a length-bound reason comes at generate time)
        env.policy.eval()  # as generate runs it: LoRA dropout in train mode does not count
        reason = gen.fused_reason(1)
        env.policy.train(was)
    if reason:
        raise ConfigError(f"rollout.generator.dtype={cfg.dtype} needs the fused decode, which does not cover this "
                          f"model: {reason}; allowed: dtype=model")
    return gen
