"""Weight-sync verification (``rollout.sync_check``): after every ``sync_weights`` a probe checks that the
engine samples from the trainer's weights.

The probe: the engine generates ``PROBE_TOKENS`` tokens greedily from a fixed prompt (the task's first
training problem) through its own ``generate``, and the trainer teacher-forces the same tokens; the check
compares the two log-probs (temperature 1: the ``Generator`` convention at temperature 0) as
gap = mean |log p_engine − log p_trainer| over the probe tokens the engine reports a log-prob for. A gap
above the tolerance is a stale engine.

Why log-probs of a probe and not a checksum of sampled weight elements: a checksum needs each engine's
weights under the trainer's names and layout, and the engines do not keep them: vLLM fuses q/k/v and gate/up
and repacks for its kernels, runs a LoRA adapter in its own LoRA layers, and a ``vllm serve`` process shows
its weights to nobody. The probe goes through the one interface every engine has (``generate``), so one
check covers the ``hf`` generator (and any copy it samples from), a colocated engine, a server, an adapter
and a Ray worker's generator, and it checks what matters: the distribution the engine samples. Its limit:
numerics differ between engines (a good sync's gap, measured on the lab: fp32 ``hf`` ~3e-7, vLLM on CPU in
fp32 ~2e-7; bf16 kernels are expected near 1e-2, not measured yet), so the tolerance
(``rollout.sync_check_tol``; 0: by ``model.dtype``, ``DEFAULT_TOL``) sits above that noise, and a stale engine
is noticed once the updates since its weights have moved the probe's log-probs by more than the tolerance (in
fp32 after one lab step at lr 1e-4: docs/scaling.md). Greedy tokens are deterministic (the same probe on both
sides of a resume); 32 of them, because the first tokens of an answer are often certain (8 missed a
one-step-stale lab engine).

Modes: ``error`` stops the run in one line naming the engine; ``resync`` (default) counts the failure in
``sync/failures``, syncs again and probes again, and stops the run only if the engine is still stale;
``none`` checks nothing. A generator registered with ``logprobs=False`` (``fake``: scripted log-probs) is never
checked. Cost: one greedy generate of ``PROBE_TOKENS`` tokens and one teacher-forced forward per probe
(``perf/sync_check_s``); an engine whose ``sync_weights`` returns True claims to sample from the trainer's own
parameters (the ``hf`` generator) and is probed only before its first generation (``CountingGenerator``), once the
claim is verified (``shares``: its ``model`` holds the trainer's parameter storage); a claim that does not hold is
a copy's, probed after every sync like one, and a stale probe's error says the engine returned True.
``sync/probe_dlogp`` is logged only for a step with a probe after a sync: a step without one (a shared engine's)
leaves it out, never logs 0 for a probe that did not run.

The asynchronous loop's weight snapshot is a copy the probe cannot judge (its engine is probed against the snapshot
itself): it is checked against the trainer's weights of the version it should hold, by an exact fingerprint
(``loop/lag.py``, ``Lag.verify``), in the same modes and counted in the same ``sync/failures``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from groupwise.lazy import no_grad, torch
from groupwise.models import fsdp
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import RunStopped
from groupwise.rollout.base import Request, SamplingParams

if TYPE_CHECKING:
    from torch import Tensor

PROBE_TOKENS = 32
"""Greedy tokens the engine generates for the probe."""
DEFAULT_TOL = {"float32": 1e-3, "float64": 1e-3, "bfloat16": 5e-2, "float16": 5e-2, "int8": 0.25}
"""``sync_check_tol: 0``: the tolerance by ``model.dtype`` (fp32: ~3000x a good sync's measured gap, ~4-18x below a
one-step-stale lab engine's; half precision: ~5x the expected bf16 noise), or by the sampler's precision (the ``hf``
generator's ``dtype: int8``: ~2-3x its mean |Δ log p| on the real model at T = 1 before its smoothing, 0.08-0.12;
1e-2 to 5e-2 since)."""


def shares(engine, model: torch.nn.Module) -> bool:
    """Whether ``engine`` samples from ``model``'s own parameters, what a ``sync_weights`` returning True claims
    (``Generator``): its ``model`` attribute is ``model``, or holds the same parameter storage (``data_ptr``). An
    engine that shows no ``model`` cannot back the claim (False: it is probed as a copy)."""
    own = getattr(engine, "model", None)
    if own is model:
        return True
    if not isinstance(own, torch.nn.Module):
        return False
    return {p.data_ptr() for p in own.parameters()} == {p.data_ptr() for p in model.parameters()}


class StaleEngineError(RunStopped):
    """An engine that does not hold the trainer's weights after a sync (and, with ``resync``, after a second): one
    line for the CLI (exit 1)."""


def stale(mode: str, retry: bool, what: str, detail: str, fix: str) -> None:
    """A stale copy was found: go on (``retry`` in ``resync`` mode: the caller copies again) or stop the run in one
    line, ``rollout.sync_check: <what> (<detail>); allowed: <fix>, or rollout.sync_check=none``."""
    if not (retry and mode == "resync"):
        again = " after a resync" if mode == "resync" else ""
        raise StaleEngineError(f"rollout.sync_check: {what}{again} ({detail}); allowed: {fix}, or "
                               "rollout.sync_check=none")


@dataclasses.dataclass(frozen=True)
class Probe:
    """What an engine generated for the probe: its greedy tokens and its log-probs of them."""

    prompt_ids: Tensor  # [P]
    completion_ids: Tensor  # [T]
    logprobs: Tensor  # [T], NaN where the engine reports none (a forced or tool token)


def probe(generator, prompt_ids: Tensor) -> Probe:
    """The engine's greedy continuation of ``prompt_ids`` (its own RNG: the run's streams are untouched)."""
    c = generator.generate([Request(prompt_ids)], SamplingParams(PROBE_TOKENS, temperature=0.0),
                           torch.Generator().manual_seed(0))[0]
    return Probe(prompt_ids, c.completion_ids, c.rollout_logprobs.float())


@no_grad
def gap(model: torch.nn.Module, p: Probe, pad_id: int) -> float:
    """mean |log p_engine − log p_trainer| over the probe tokens with an engine log-prob (the trainer's
    teacher-forced pass, eval mode, temperature 1); 0 when there is none."""
    known = torch.isfinite(p.logprobs)
    if not bool(known.any()):
        return 0.0
    was = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        packed = pack([p.prompt_ids], [p.completion_ids], pad_id, dev)
        trainer = completion_logprobs(model, packed, 1.0).logprobs[0, :len(p.completion_ids)].float().cpu()
    finally:
        model.train(was)
    return float((p.logprobs[known] - trainer[known]).abs().mean())


class SyncCheck:
    """The run's check: its mode, tolerance and probe prompt, and this step's counts (``metrics``)."""

    def __init__(self, mode: str, tol: float, prompt_ids: Tensor, pad_id: int):
        self.mode, self.tol, self.prompt_ids, self.pad_id = mode, tol, prompt_ids, pad_id
        self.failures, self.seconds, self.worst, self.probed = 0, 0.0, 0.0, 0

    def stale(self, model: torch.nn.Module, p: Probe, logged: bool = True) -> float | None:
        """The probe's gap when it is over the tolerance (None: the engine holds the trainer's weights);
        ``logged``: the gap counts toward ``sync/probe_dlogp``."""
        t0 = time.perf_counter()
        with fsdp.full_weights(model):  # under FSDP the trainer's pass needs the whole weights (a no-op otherwise)
            g = gap(model, p, self.pad_id)
        self.seconds += time.perf_counter() - t0
        if logged:
            self.worst, self.probed = max(self.worst, g), self.probed + 1
        return g if not g <= self.tol else None  # a NaN gap is stale too

    def failed(self, engine: str, g: float, retry: bool) -> None:
        """Count a stale probe of ``engine``; raise unless ``retry`` (resync mode, first failure)."""
        self.failures += 1
        stale(self.mode, retry, f"{engine} does not hold the trainer's weights",
              f"probe mean |Δ log p| {g:.2e} > rollout.sync_check_tol {self.tol:.0e}", "fix its weight sync")

    def verify(self, engine: str, generator, model: torch.nn.Module, resync: Callable[[], None],
               logged: bool = True) -> Probe:
        """Probe ``generator`` against ``model``; on a stale probe count it and, in ``resync`` mode, call
        ``resync`` and probe once more (still stale: raise). Returns the last probe. ``logged=False`` (the probe
        before an engine's first generation): its gap stays out of ``sync/probe_dlogp``, so that a resumed run
        logs what the uninterrupted run logged; a failure is counted all the same."""
        for retry in (True, False):
            t0 = time.perf_counter()
            with fsdp.full_weights(model):
                p = probe(generator, self.prompt_ids)
            self.seconds += time.perf_counter() - t0
            g = self.stale(model, p, logged)
            if g is None:
                return p
            self.failed(engine, g, retry)
            resync()
        return p

    def metrics(self) -> dict[str, float]:
        """``sync/failures`` (stale probes this step, 0 normally), ``sync/probe_dlogp`` (the largest gap of the
        step's probes after a sync; absent when none ran: a 0 would read as a probe that passed),
        ``perf/sync_check_s``; reset for the next step."""
        out = {"sync/failures": float(self.failures), "perf/sync_check_s": self.seconds}
        if self.probed:
            out["sync/probe_dlogp"] = self.worst
        self.failures, self.seconds, self.worst, self.probed = 0, 0.0, 0.0, 0
        return out


def tolerance(tol: float, dtype: str) -> float:
    """``rollout.sync_check_tol``, with 0 resolved by the model's dtype (``DEFAULT_TOL``)."""
    return tol if tol > 0 else DEFAULT_TOL.get(dtype, DEFAULT_TOL["float16"])  # (another dtype: half precision's)
