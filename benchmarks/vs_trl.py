#!/usr/bin/env python
"""groupwise vs TRL ``GRPOTrainer`` (no vLLM) on identical work, on CPU, in one invocation.

    PYTHONPATH=src python benchmarks/vs_trl.py                  # lab-small, random init, full-length
    PYTHONPATH=src python benchmarks/vs_trl.py --warm-start     # SFT warm start, completions stop at EOS
    PYTHONPATH=src python benchmarks/vs_trl.py --quick          # seconds; what the smoke test runs
    PYTHONPATH=src python benchmarks/vs_trl.py --model smollm2-135m-instruct
                                                                # regime "real" (minutes per step)

Both sides load one saved model directory, train on the same lab prompts (the ``random`` selector's draws for
steps 0..N-1, rendered with the tokenizer's chat template), with the same G, prompts per step, completion cap,
learning rate, AdamW, grad clip 1, fp32, temperature 1, no KL, one update per batch and token-mean loss over
the step (TRL ``loss_type="dapo"`` = groupwise ``loss.reduction=token_mean``). Each side runs in its own
subprocess (so peak RSS is per side), the sides alternate TRL, groupwise, groupwise, TRL, ... (``--repeats``
pairs), and both are timed the same way: wall and process CPU time around one optimizer step (TRL: a
``TrainerCallback`` from ``on_step_begin`` to ``on_step_end``; groupwise: around ``rl_step``). Medians are
over steps 2..N; CPU time is the steadier number on a shared machine.

Regimes (see docs/benchmarks.md):
  default       random-init model whose EOS id lies outside the model's vocabulary, so no completion can
                stop early: every completion is exactly ``--max-tokens`` tokens on both sides. The reward is
                ``dense`` (correctness + 0.01 x digit share of the completion) so that every group has reward
                variance and both sides train every row (with plain correctness a random model scores 0
                everywhere and groupwise would skip the whole update).
  --warm-start  groupwise's cached SFT warm start of the embedded preset (the lab traces), with the real EOS;
                completions stop at EOS. The reward is the lab's correctness verifier; groupwise skips rows
                of zero-variance groups (TRL trains them with zero advantage), reported as "rows trained".

  --model M     (regime "real") a pretrained model: anything ``model.path`` accepts (a directory, a .gguf
                file, a hub id, the alias ``smollm2-135m-instruct``), resolved once (``models/sources.py``)
                and loaded by both sides from that directory; the problems are ``--recipe``'s task (default
                recipes/smollm2_math.yaml: reasoning-gym arithmetic behind a system prompt and two worked
                examples, rendered with the model's chat template, scored by math-verify), completions stop at
                EOS, every weight is trained (no LoRA on either side) at lr 1e-5 unless ``--lr`` says
                otherwise. groupwise's side also takes the recipe's ``optim`` (e.g. ``micro_batch_tokens``),
                except the fields pinned to TRL's (``PINNED_OPTIM``: lr, AdamW, schedule, clip, one epoch).

  --prefix-tokens N  (regime C) every prompt behind the same N-token system prompt, as a chat system message on
                both sides (real RLVR prompts are 100-500 tokens shared by a group's G completions).

groupwise's ``optim.shared_prefix`` (each group's prompt runs once in the update; generation always prefills it once
per group) is on, as groupwise ships it (or as ``--recipe``'s ``optim`` sets it in regime real);
``--no-shared-prefix`` turns it off (``--shared-prefix``, on, is the default and kept for old command lines).

Equal executed work (issue 45): ``--trl-micro-batch M`` runs TRL's update in micro-batches of M rows
(``per_device_train_batch_size`` M, ``gradient_accumulation_steps`` rows / M, one generation per optimizer step), its
documented way to cut padding; ``--trl-generation continuous`` switches TRL to transformers' continuous batching (it
runs on CPU, but ~200x slower than ``generate`` at lab-tiny and with an 11.9 GB paged cache: not CPU-friendly).
``--count-flops`` adds one run per side under ``executed_flops`` (a dispatch mode that adds up torch's per-op FLOP
formulas over every executed matmul and attention op, by phase, with the LM head's part), not timed; it must
replay its side's first timed run token for token (else a WARNING), and the table then splits the TRL/groupwise
CPU-time ratio into executed work (TRL's executed FLOPs / groupwise's: skipped rows, padding, shared prompts, the
LM head over prompt positions) times engine speed (executed FLOPs per CPU second, groupwise's / TRL's).

Model FLOPs per step = 2·N·Σ(P+T) (generation forwards) + 6·N·Σ(P+T) (training forward + backward), with N
the parameter count (tied embeddings counted once), P and T each completion's prompt and completion tokens;
the attention score FLOPs are ignored (< 3% here). "% peak" divides FLOP/s by the best fp32 ``torch.mm`` rate
measured in the same invocation with the same thread count.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("trl", "groupwise")
# The lab's default chains (2-4 of + and -, mod 10) with the grpo_lab recipe's removable flaw (wrapping steps
# off by one 60% of the time); the flaw shapes the warm-start traces only, so sampled accuracy stays mixed.
TASK = {"name": "lab", "p_wrap_slip": 0.6}
NO_EOS = "<noeos>"


@dataclasses.dataclass
class Options:
    preset: str = "lab-small"
    steps: int = 10
    prompts: int = 8
    group: int = 8
    max_tokens: int = 64
    threads: int = 1
    repeats: int = 2
    warm_start: bool = False
    warm_start_steps: int = 300
    warm_start_lr: float = 3e-3  # pinned, with batch 64: the cached warm start must not move with defaults
    reward: str = "auto"
    lr: float = 1e-4
    seed: int = 0
    matmul_n: int = 2048
    sides: tuple[str, ...] = SIDES
    workdir: str | None = None
    prefix_tokens: int = 0
    shared_prefix: bool | None = None  # None: groupwise's default (on), or the recipe's optim in regime real
    fused_decode: bool = False
    gw: tuple[str, ...] = ()  # groupwise-only config overrides (``key=value``), e.g. one lever switched off
    model: str = ""  # regime "real": a pretrained model (``model.path`` syntax); "" = the embedded preset
    recipe: str = "recipes/smollm2_math.yaml"  # regime "real": the recipe whose task supplies the problems
    device: str = "cpu"  # both sides' model.device ("cuda": benchmarks/gpu_check.sh); "% peak" stays the CPU probe's
    dtype: str = "float32"  # both sides' weights and compute (TRL: bf16=True for bfloat16)
    trl_micro_batch: int = 0  # TRL's per_device_train_batch_size (0: every row in one micro-batch, as before)
    trl_generation: str = "generate"  # or "continuous": TRL's use_transformers_continuous_batching
    count_flops: bool = False  # one more run per side under ExecutedFlops (not timed): executed FLOPs per step

    @property
    def reward_kind(self) -> str:
        return self.reward if self.reward != "auto" else ("correctness" if self.warm_start or self.model
                                                          else "dense")

    @property
    def label(self) -> str:
        return self.model or self.preset


QUICK = dict(preset="lab-tiny", steps=2, prompts=2, group=4, max_tokens=8, repeats=1, matmul_n=256)
# groupwise's optim fields set to what the TRL side does (identical work); the rest of ``optim`` is groupwise's
# defaults, or the recipe's own in regime real (``real_model_dir``), then ``--no-shared-prefix`` and ``--gw``
PINNED_OPTIM = ("lr", "betas", "eps", "weight_decay", "warmup_steps", "schedule", "grad_clip", "ppo_epochs")


# ------------------------------------------------------------------------------------------ shared pieces
def _use_src() -> None:
    try:
        import groupwise  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "src"))


def build_task(task: dict, seed: int):
    """The groupwise task a ``task:`` mapping names (the lab by default), built as a run builds it."""
    from groupwise import config as gconfig
    from groupwise.registry import BuildEnv

    cfg = gconfig.load(None, (), base={"task": task, "seed": seed})
    return cfg.task.build(BuildEnv(run=cfg, seed=seed))


def plan(spec: dict):
    """The task and the problems of each step: exactly what groupwise's ``random`` selector draws."""
    from groupwise.standard.random_selector import RandomSelector

    task = build_task(spec.get("task", TASK), spec["seed"])
    selector = RandomSelector(task, spec["seed"])
    return task, [selector.next(step, spec["prompts"]) for step in range(spec["steps"])]


def system_prompt(model_dir: str, n: int) -> str:
    """A fixed system prompt of exactly ``n`` tokens of the model's tokenizer ("" for 0): regime C's shared
    prefix, the same text on both sides."""
    if n <= 0:
        return ""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    text = "You are a careful calculator. Work through the chain one step at a time, mod 10, then answer. " * n
    return tok.decode(tok.encode(text, add_special_tokens=False)[:n])


def messages(problem, system: str) -> list[dict]:
    """The chat messages of one problem on both sides: the system prompt (if any), then the problem's prompt
    (the lab's plain text as a user turn, or a task's own chat messages)."""
    own = ([{"role": "user", "content": problem.prompt}] if isinstance(problem.prompt, str)
           else list(problem.prompt))
    return [*([{"role": "system", "content": system}] if system else []), *own]


def reward_value(task, problem, text: str, kind: str) -> float:
    """``correctness``: the lab verifier (last ``<answer>`` equals the gold answer), 0/1. ``dense``: that plus
    0.01 x the share of digit characters in the completion, so random completions still differ in reward."""
    r = float(task.verify(problem, text))
    if kind == "dense":
        r += 0.01 * sum(ch.isdigit() for ch in text) / max(len(text), 1)
    return r


def make_model_dir(opts: Options, dest: Path) -> dict:
    """Save the one model directory both sides load (``save_pretrained`` + tokenizer); regime "real": the
    pretrained model's own directory, resolved (converted once, cached) by ``models/sources.py``."""
    _use_src()
    import torch

    from groupwise.models import tiny

    torch.set_num_threads(opts.threads)
    if opts.model:
        return real_model_dir(opts)
    if opts.warm_start:
        from groupwise.config import ModelConfig
        from groupwise.models.warm_start import ensure_warm_start
        from groupwise.standard.lab import Lab, LabConfig

        lab = Lab(LabConfig(**{k: v for k, v in TASK.items() if k != "name"}), opts.seed)
        t = time.perf_counter()
        mcfg = ModelConfig(path=f"embedded:{opts.preset}", warm_start_steps=opts.warm_start_steps,
                           warm_start_lr=opts.warm_start_lr, warm_start_batch=64)
        src = ensure_warm_start(opts.preset, lab, mcfg)
        shutil.copytree(src, dest, dirs_exist_ok=True)
        regime = (f"SFT warm start ({opts.warm_start_steps} steps x 64, lr {opts.warm_start_lr:g}; cached as "
                  f"{src}), completions stop at EOS")
        setup = time.perf_counter() - t
    else:
        tok = tiny.build_tokenizer()
        model = tiny.build_model(opts.preset, tok, seed=opts.seed)
        # An EOS id the model cannot emit (one past its vocabulary): every completion runs to the cap on both
        # sides, i.e. identical token counts (what ignore_eos / min_new_tokens do, which groupwise lacks).
        tok.add_special_tokens({"eos_token": NO_EOS})
        model.config.eos_token_id = None
        model.generation_config.eos_token_id = tok.eos_token_id
        model.save_pretrained(dest, safe_serialization=True)
        tok.save_pretrained(dest)
        regime = f"random init, EOS unreachable: every completion is exactly {opts.max_tokens} tokens"
        setup = 0.0
    from transformers import AutoModelForCausalLM

    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(dest).parameters())
    return {"model_dir": str(dest), "params": n, "regime": regime, "model_setup_s": setup}


def real_model_dir(opts: Options) -> dict:
    import yaml
    from transformers import AutoConfig

    from groupwise.models import sources

    t = time.perf_counter()
    model_dir = sources.resolve(opts.model)
    recipe = yaml.safe_load((ROOT / opts.recipe).read_text())
    task, optim = recipe["task"], dict(recipe.get("optim") or {})
    n = sources.count_params(model_dir)
    kind = AutoConfig.from_pretrained(model_dir).model_type
    own = ", ".join(f"{k}={v}" for k, v in optim.items() if k not in PINNED_OPTIM)
    regime = (f"real: {opts.model} ({kind}, {model_dir.name}), {opts.recipe}'s task "
              f"({task.get('dataset', task['name'])}), chat template, completions stop at EOS, "
              "full fine-tuning" + (f"; groupwise the recipe's optim: {own}" if own else ""))
    return {"model_dir": str(model_dir), "params": n, "regime": regime,
            "model_setup_s": time.perf_counter() - t, "task": task, "optim": optim}


def matmul_peak(n: int, threads: int, reps: int = 5) -> dict:
    """Best fp32 ``torch.mm`` FLOP/s (2·n³/t) for n x n matrices at ``threads`` intra-op threads, per wall
    second and per CPU second of this process (the latter is what a core delivers when it is not shared)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    wall = cpu = float("inf")
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return {"wall": 2 * n**3 / wall, "cpu": 2 * n**3 / max(cpu, 1e-9)}


def executed_flops(vocab: int, other_dims: set[int], hidden: int = 0):
    """A ``TorchDispatchMode`` that adds up the FLOPs of every matmul and attention op a process executes (torch's
    own per-op formulas, ``torch.utils.flop_counter``; ops without one are decomposed first, as its
    ``FlopCounterMode`` does), by phase (``.phase``: "generation" inside generate, else "update") and, when the
    vocabulary can be told apart from every other dimension (``vocab`` >= 4096 and none of the model's other
    sizes), the LM head's part: a matmul with the vocabulary among its dimensions (head forward, and both of its
    backward GEMMs), or (``hidden`` given) one that reads or writes a tile of a ``vocab`` x ``hidden`` tensor's
    storage (the head's weight or its gradient: TRL's chunked log-prob kernel multiplies vocabulary tiles of 32,768
    rows, a size no shape test can name). Decomposed attention runs slower, so a counted run is never a timed one."""
    from collections import Counter

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    sdpa, sdpa_back = aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward
    formulas = {**flop_registry,  # torch's registry lacks the CPU flash-attention kernels: the same formulas
                aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[sdpa],
                aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_registry[sdpa_back],
                # in place, as TRL's chunked log-prob kernel accumulates its gradients (torch's registry has only
                # the out-of-place ops, and neither decomposes: uncounted before 2026-12-07)
                aten.addmm_: flop_registry[aten.addmm], aten.baddbmm_: flop_registry[aten.baddbmm]}
    head_told = vocab >= 4096 and vocab not in other_dims
    mats = {"mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_"}

    class ExecutedFlops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase, self.counts, self.head_told = "update", Counter(), head_told

        @staticmethod
        def head(*tensors) -> bool:
            ts = [t for t in tensors if isinstance(t, torch.Tensor)]
            return any(vocab in t.shape for t in ts) or bool(hidden) and any(
                t.untyped_storage().nbytes() == vocab * hidden * t.element_size() for t in ts)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            packet = func._overloadpacket
            if packet not in formulas:
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
                return func(*args, **kwargs)
            out = func(*args, **kwargs)
            flops = formulas[packet](*args, **kwargs, out_val=out)
            self.counts[self.phase] += flops
            if head_told and packet.__name__ in mats and self.head(out, *args):
                self.counts[f"{self.phase}_head"] += flops
            return out

    return ExecutedFlops()


def flop_counter_for(spec: dict):
    """The executed-FLOP counter for ``spec``'s model (None unless ``count_flops``)."""
    if not spec.get("count_flops"):
        return None
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(spec["model_dir"], local_files_only=True)
    dims = {getattr(c, k, None) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                          "num_key_value_heads", "head_dim", "max_position_embeddings")}
    return executed_flops(c.vocab_size, {d for d in dims if isinstance(d, int)}, c.hidden_size)


def timed(fn, rec: dict, counter):
    """``fn`` (a side's generate call) adding its wall and CPU seconds to ``rec`` and, with a counter, counting its
    FLOPs as generation."""
    def wrapped(*args, **kwargs):
        t, cpu = time.perf_counter(), time.process_time()
        if counter is not None:
            counter.phase = "generation"
        try:
            return fn(*args, **kwargs)
        finally:
            if counter is not None:
                counter.phase = "update"
            rec["gen_s"] += time.perf_counter() - t
            rec["gen_cpu_s"] += time.process_time() - cpu

    return wrapped


def _counted(counter, before: dict) -> dict:
    """The counter's FLOPs since the snapshot ``before`` (a step's executed work)."""
    out = {k: counter.counts[k] - before.get(k, 0) for k in ("generation", "update", "generation_head", "update_head")}
    return {**out, "head_told": float(counter.head_told)}


# ------------------------------------------------------------------------------------------- the sides
def _step_record(t: float, cpu: float, rec: dict, **extra) -> dict:
    import torch

    return {"step_s": t, "cpu_s": cpu, "gen_s": rec["gen_s"], "gen_cpu_s": rec["gen_cpu_s"],
            "gen_tokens": rec["gen_tokens"], "prompt_tokens": rec["prompt_tokens"],
            "problem_ids": sorted(set(rec["ids"])),
            "threads": torch.get_num_threads(), **extra}


def group_optim(spec: dict) -> dict:
    """groupwise's ``optim``: the recipe's (regime real; groupwise's defaults otherwise), the fields TRL's side
    pins (``PINNED_OPTIM``) set to its values, and ``shared_prefix`` where ``--[no-]shared-prefix`` said."""
    pinned = {"lr": spec["lr"], "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "warmup_steps": 0,
              "schedule": "constant", "grad_clip": 1.0, "ppo_epochs": 1}
    assert tuple(pinned) == PINNED_OPTIM
    out = {**spec.get("optim", {}), **pinned}
    if spec.get("shared_prefix") is not None:
        out["shared_prefix"] = bool(spec["shared_prefix"])
    return out


def side_groupwise(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    from groupwise import config as gconfig
    from groupwise.loop.setup import build
    from groupwise.loop.trainer import rl_step
    from groupwise.registry import NoConfig
    from groupwise.rewards import REWARDS, per_sample

    reward = "correctness"
    if spec["reward"] == "dense":  # a plug-in reward term, registered the way any user's would be
        reward = "bench_dense"
        if reward not in REWARDS:
            REWARDS.register(reward, config=NoConfig)(
                lambda cfg, env: per_sample(lambda s, p: reward_value(env.task, p, s.text, "dense")))
    base = {
        "name": "vs_trl", "out_dir": spec["workdir"], "seed": spec["seed"],
        "model": {"path": spec["model_dir"], "warm_start": False, "dtype": spec.get("dtype", "float32"),
                  "device": spec.get("device", "cpu")},
        "task": dict(spec.get("task", TASK)),
        "rollout": {"prompts_per_step": spec["prompts"], "group_size": spec["group"],
                    "max_completion_tokens": spec["max_tokens"], "temperature": 1.0, "top_p": 1.0,
                    # benchmarks/gpu_engines.py: a colocated vLLM engine on both sides
                    "generator": {"name": "vllm", "gpu_memory_utilization": 0.3} if spec.get("vllm") else
                    {"name": "hf", **({"decode": "fused"} if spec.get("fused_decode") else {})}},
        "reward": {"terms": [{"name": reward}]},
        "advantage": {"name": "grpo"},
        "loss": {"terms": [{"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}],
                 "reduction": "token_mean"},
        "optim": group_optim(spec),
        "trainer": {"steps": spec["steps"], "threads": spec["threads"], "progress": False, "sinks": []},
        "eval": {"before": False, "after": False},
    }
    cfg = gconfig.load(None, tuple(spec.get("gw", ())), base=base)
    t0 = time.perf_counter()
    c = build(cfg)
    setup_s = time.perf_counter() - t0

    rec: dict = {}
    generate, builder, select = c.generator.generate, c.builder, c.selector.next
    system = system_prompt(spec["model_dir"], spec.get("prefix_tokens", 0))

    def with_system(step, n, ctx):  # regime C: every problem behind the same system prompt, as a chat message
        return [dataclasses.replace(p, prompt=tuple(messages(p, system))) for p in select(step, n, ctx)]

    if system:
        c.selector.next = with_system

    counter = flop_counter_for(spec)
    generate = timed(generate, rec, counter)

    def counted_generate(requests, params, rng):
        out = generate(requests, params, rng)
        rec["prompt_tokens"] += sum(r.prompt_ids.numel() for r in requests)
        rec["gen_tokens"] += sum(o.completion_ids.numel() for o in out)
        return out

    def recording_builder(problems, ctx):
        rec["ids"] += [p.id for p in problems]
        return builder(problems, ctx)

    c.generator.generate, c.builder = counted_generate, recording_builder
    steps = []
    with counter if counter is not None else contextlib.nullcontext():
        for step in range(spec["steps"]):
            rec.update(gen_s=0.0, gen_cpu_s=0.0, gen_tokens=0, prompt_tokens=0, ids=[])
            before = dict(counter.counts) if counter is not None else {}
            t, cpu = time.perf_counter(), time.process_time()
            m = rl_step(c, step)
            dt, dcpu = time.perf_counter() - t, time.process_time() - cpu
            steps.append(_step_record(
                dt, dcpu, rec, rows=m["rollout/samples"],
                rows_trained=m["rollout/samples"] - m["update/skipped_rows"],
                zero_std_frac=m["adv/zero_std_group_frac"], reward_mean=m["reward/mean"],
                rollout_s=m["perf/rollout_s"], update_s=m["perf/update_s"],
                **({"flops": _counted(counter, before)} if counter is not None else {})))
    path = getattr(getattr(c.generator, "inner", c.generator), "decode_path", "")  # the last generate call's
    asked = getattr(cfg.rollout.generator.cfg, "decode", "model") != "model"  # auto (the default) or fused
    return {"steps": steps, "setup_s": setup_s, "decode_path": path if asked else "not asked",
            "resolved": {k.split("=", 1)[0]: resolved(cfg, k.split("=", 1)[0]) for k in spec.get("gw", ())}}


def resolved(cfg, key: str):
    """The value a dotted config key resolved to (stepping into a component's own config), as written."""
    node = cfg
    for part in key.split("."):
        node = getattr(node.cfg if hasattr(node, "kind") and not hasattr(node, part) else node, part)
    return node


def side_trl(spec: dict) -> dict:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renamed gradient_checkpointing
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    lab, problems = plan(spec)
    flat = [p for ps in problems for p in ps]
    tok = AutoTokenizer.from_pretrained(spec["model_dir"], local_files_only=True)
    tok.padding_side = "left"
    dtype, device = getattr(torch, spec.get("dtype", "float32")), spec.get("device", "cpu")
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=dtype, local_files_only=True).to(device)
    system = system_prompt(spec["model_dir"], spec.get("prefix_tokens", 0))
    chats = [messages(p, system) for p in flat]
    prompt_len = [len(tok.encode(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                                 add_special_tokens=False)) for m in chats]
    data = Dataset.from_list([{"prompt": m, "idx": i} for i, m in enumerate(chats)])
    kind = spec["reward"]
    rec: dict = {}

    def reward(prompts, completions, completion_ids, idx, **kwargs):
        rec["gen_tokens"] += sum(len(c) for c in completion_ids)
        rec["prompt_tokens"] += sum(prompt_len[i] for i in idx)
        rec["ids"] += [flat[i].id for i in idx]
        values = [reward_value(lab, flat[i], c[0]["content"], kind) for i, c in zip(idx, completions)]
        groups: dict[int, list[float]] = {}
        for i, v in zip(idx, values):
            groups.setdefault(i, []).append(v)
        rec["zero_std"] = sum(len(set(g)) == 1 for g in groups.values()) / len(groups)
        rec["reward_mean"] = sum(values) / len(values)
        return values

    reward.__name__ = kind
    steps: list[dict] = []
    batch = spec["prompts"] * spec["group"]
    micro = spec.get("trl_micro_batch") or batch
    if batch % micro:
        raise ValueError(f"--trl-micro-batch {micro}: must divide the step's {batch} rows")
    counter = flop_counter_for(spec)
    continuous = spec.get("trl_generation", "generate") == "continuous"
    name = "generate_batch" if continuous else "generate"  # what TRL's generation calls on the model
    setattr(model, name, timed(getattr(model, name), rec, counter))

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            rec.update(gen_s=0.0, gen_cpu_s=0.0, gen_tokens=0, prompt_tokens=0, ids=[], zero_std=0.0,
                       reward_mean=0.0)
            self.before = dict(counter.counts) if counter is not None else {}
            self.t, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            dt, dcpu = time.perf_counter() - self.t, time.process_time() - self.cpu
            steps.append(_step_record(dt, dcpu, rec, rows=float(batch), rows_trained=float(batch),
                                      zero_std_frac=rec["zero_std"], reward_mean=rec["reward_mean"],
                                      **({"flops": _counted(counter, self.before)} if counter is not None
                                         else {})))

    args = GRPOConfig(
        output_dir=str(Path(spec["workdir"]) / "trl"), seed=spec["seed"], max_steps=spec["steps"],
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro, generation_batch_size=batch,
        use_transformers_continuous_batching=continuous,
        num_generations=spec["group"], max_completion_length=spec["max_tokens"], shuffle_dataset=False,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=0.2, num_iterations=1,
        temperature=1.0, top_p=1.0, top_k=0, use_vllm=bool(spec.get("vllm")),
        **({"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3} if spec.get("vllm") else {}),
        bf16=spec.get("dtype") == "bfloat16", fp16=False, gradient_checkpointing=False,
        use_cpu=spec.get("device", "cpu") == "cpu", save_strategy="no",
        report_to="none", logging_steps=max(spec["steps"], 1), disable_tqdm=True, dataloader_num_workers=0,
    )
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data,
                          processing_class=tok, callbacks=[Timer()])
    setup_s = time.perf_counter() - t0
    with counter if counter is not None else contextlib.nullcontext():
        trainer.train()
    return {"steps": steps, "setup_s": setup_s}


def run_here(side: str, spec: dict) -> dict:
    """Run one side in this process; ``maxrss_mb`` is this process's peak RSS so far."""
    import resource

    _use_src()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t = time.perf_counter()
    out = (side_trl if side == "trl" else side_groupwise)(spec)
    out.update(side=side, wall_s=time.perf_counter() - t,
               maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def child_main(side: str, spec_path: str, out_path: str) -> None:
    out = run_here(side, json.loads(Path(spec_path).read_text()))
    Path(out_path).write_text(json.dumps(out))


def run_side(side: str, spec: dict, workdir: Path, tag: str) -> dict:
    """Run one side in a fresh interpreter (so peak RSS is its own) and return its per-step records."""
    spec_path, out_path, log_path = (workdir / f"{tag}.{x}" for x in ("spec.json", "out.json", "log"))
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(spec["threads"]), MKL_NUM_THREADS=str(spec["threads"]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    with log_path.open("w") as log:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", side,
                               str(spec_path), str(out_path)], stdout=log, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0 or not out_path.exists():
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{side} side failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    return json.loads(out_path.read_text())


# ---------------------------------------------------------------------------------------------- summary
def summarize_run(run: dict, params: int, peak: dict) -> dict:
    steps = run["steps"][1:] if len(run["steps"]) > 1 else run["steps"]  # step 1 warms up caches
    med = lambda key: statistics.median(s[key] for s in steps)  # noqa: E731
    mean = lambda key: statistics.fmean(s[key] for s in steps)  # noqa: E731
    tokens = mean("prompt_tokens") + mean("gen_tokens")  # Σ(P+T) over the step's completions
    flops = 2 * params * tokens + 6 * params * tokens
    out = {"side": run["side"], "step_s": med("step_s"), "cpu_s": med("cpu_s"), "gen_s": med("gen_s"),
           "gen_cpu_s": med("gen_cpu_s"), "gen_tokens": mean("gen_tokens"),
           "prompt_tokens": mean("prompt_tokens"),
           "gen_tok_per_s": statistics.median(s["gen_tokens"] / s["step_s"] for s in steps),
           "rows_trained": mean("rows_trained"), "zero_std_frac": mean("zero_std_frac"),
           "reward_mean": mean("reward_mean"), "flops_per_step": flops, "maxrss_mb": run["maxrss_mb"],
           "threads": sorted({s["threads"] for s in run["steps"]})}
    out["gen_share"] = out["gen_s"] / out["step_s"]
    out["peak_frac"] = flops / out["step_s"] / peak["wall"]
    out["peak_frac_cpu"] = flops / out["cpu_s"] / peak["cpu"]
    if "update_s" in steps[0]:
        out["rollout_s"], out["update_s"] = med("rollout_s"), med("update_s")
    return out


def summarize(runs: list[dict], params: int, peak: dict) -> dict:
    """Per run: medians over steps 2..N. Per side: the median of its runs' values and the range of s/step."""
    per_run = [summarize_run(r, params, peak) for r in runs]
    sides = {}
    for side in dict.fromkeys(r["side"] for r in per_run):
        rs = [r for r in per_run if r["side"] == side]
        agg = {k: statistics.median(r[k] for r in rs) for k, v in rs[0].items() if isinstance(v, float)}
        for k in ("step_s", "cpu_s"):
            agg[f"{k}_range"] = [min(r[k] for r in rs), max(r[k] for r in rs)]
        agg["repeats"] = len(rs)
        sides[side] = agg
    out = {"per_run": per_run, "sides": sides}
    if {"trl", "groupwise"} <= sides.keys():
        for k in ("step_s", "cpu_s"):
            trl = [r[k] for r in per_run if r["side"] == "trl"]
            gw = [r[k] for r in per_run if r["side"] == "groupwise"]
            out[f"ratio_{k}"] = sides["trl"][k] / sides["groupwise"][k]
            out[f"ratio_{k}_per_repeat"] = [a / b for a, b in zip(trl, gw)]
    return out


def check_identical(runs: list[dict]) -> list[str]:
    """Warnings if the sides did not see the same problems or prompt tokens, step by step."""
    warn = []
    by_side: dict[str, dict] = {}
    for r in runs:
        by_side.setdefault(r["side"], r)
    if len(by_side) == 2:
        a, b = by_side["trl"]["steps"], by_side["groupwise"]["steps"]
        if [s["problem_ids"] for s in a] != [s["problem_ids"] for s in b]:
            warn.append("the two sides trained on different problems")
        if [s["prompt_tokens"] for s in a] != [s["prompt_tokens"] for s in b]:
            warn.append("the two sides' prompt token counts differ")
    return warn


def check_counted(runs: list[dict], counted: list[dict]) -> list[str]:
    """Warnings where a counted run did not replay its side's first timed run (the same generated tokens, step by
    step): its FLOPs would then be another run's work."""
    warn = []
    for c in counted:
        timed = next(r for r in runs if r["side"] == c["side"])
        if [s["gen_tokens"] for s in c["steps"]] != [s["gen_tokens"] for s in timed["steps"]]:
            warn.append(f"{c['side']}: the counted run generated other tokens than the timed run (its executed "
                        "FLOPs are of other samples)")
    return warn


def executed_summary(summary: dict, counted: list[dict], peak: dict) -> dict:
    """Per side: executed GFLOP per step (steps 2..N of the counted run, mean), its split, and the share of the
    matmul peak it is run at (executed FLOPs over the timed runs' median step); then the TRL/groupwise CPU-time
    ratio as the product of executed work (TRL's FLOPs / groupwise's) and engine speed (groupwise's executed FLOPs
    per CPU second / TRL's); and each phase's executed FLOPs per CPU second of that phase (generation: inside the
    generate calls; update: the rest of the step)."""
    out: dict = {}
    for c in counted:
        steps = c["steps"][1:] or c["steps"]
        mean = {k: statistics.fmean(s["flops"][k] for s in steps) for k in steps[0]["flops"]}
        total = mean["generation"] + mean["update"]
        side = summary["sides"][c["side"]]
        out[c["side"]] = {**mean, "total": total, "peak_frac": total / side["step_s"] / peak["wall"],
                          "peak_frac_cpu": total / side["cpu_s"] / peak["cpu"],
                          "per_cpu_s": total / side["cpu_s"],
                          "gen_per_cpu_s": mean["generation"] / max(side["gen_cpu_s"], 1e-9),
                          "update_per_cpu_s": mean["update"] / max(side["cpu_s"] - side["gen_cpu_s"], 1e-9)}
    if {"trl", "groupwise"} <= out.keys() and "ratio_cpu_s" in summary:
        t, g = out["trl"], out["groupwise"]
        out["work_ratio"] = t["total"] / g["total"]
        out["speed_ratio"] = g["per_cpu_s"] / t["per_cpu_s"]  # work_ratio x speed_ratio == ratio_cpu_s
    return out


def table(result: dict) -> str:
    s, o = result["summary"], result["options"]
    pk = result["peak_flops"]
    probes = ", ".join(f"{p / 1e9:.0f}" for p in result["peak_probes"])
    lines = [
        f"groupwise vs TRL {result['versions']['trl']} GRPOTrainer | {o['model'] or o['preset']} "
        f"({result['params'] / 1e6:.2f}M params) | {result['regime']} | reward {result['reward']}",
        f"work/step: {o['prompts']} prompts x G={o['group']} = {o['prompts'] * o['group']} completions, cap "
        f"{o['max_tokens']} | fp32, {o['threads']} thread(s), lr {o['lr']} | {o['steps']} steps x "
        f"{o['repeats']} run(s) per side, alternating; medians over steps 2..N, then over runs",
        f"fp32 matmul peak ({o['matmul_n']}^3 torch.mm, best probe): {pk['wall'] / 1e9:.1f} GFLOP/s per wall "
        f"s, {pk['cpu'] / 1e9:.1f} per CPU s (wall probes: {probes})",
        "",
        f"{'side':<10} {'s/step':>7} {'range':>13} {'cpu s':>7} {'range':>13} {'gen s':>6} {'gen%':>5} "
        f"{'gen tok':>7} {'tok/s':>6} {'rows':>5} {'GFLOP':>6} {'%peak':>6} {'%pk cpu':>7} {'RSS MB':>6}",
    ]
    for side, a in s["sides"].items():
        wall, cpu = "{:.2f}-{:.2f}".format(*a["step_s_range"]), "{:.2f}-{:.2f}".format(*a["cpu_s_range"])
        lines.append(
            f"{side:<10} {a['step_s']:>7.2f} {wall:>13} {a['cpu_s']:>7.2f} {cpu:>13} "
            f"{a['gen_s']:>6.2f} {100 * a['gen_share']:>4.0f}% {a['gen_tokens']:>7.0f} "
            f"{a['gen_tok_per_s']:>6.0f} "
            f"{a['rows_trained']:>5.1f} {a['flops_per_step'] / 1e9:>6.1f} {100 * a['peak_frac']:>5.1f}% "
            f"{100 * a['peak_frac_cpu']:>6.1f}% {a['maxrss_mb']:>6.0f}")
    if "ratio_step_s" in s:
        pr = ", ".join(f"{x:.2f}" for x in s["ratio_step_s_per_repeat"])
        pc = ", ".join(f"{x:.2f}" for x in s["ratio_cpu_s_per_repeat"])
        lines.append(f"\nTRL/groupwise s/step: {s['ratio_step_s']:.2f}x wall (per run pair: {pr}); "
                     f"{s['ratio_cpu_s']:.2f}x CPU time (per run pair: {pc})")
    gw = s["sides"].get("groupwise")
    if gw and "rollout_s" in gw:
        lines.append(f"groupwise split (its perf/* metrics): rollout {gw['rollout_s']:.2f} s (generate "
                     f"{gw['gen_s']:.2f} s), update {gw['update_s']:.2f} s; zero-variance groups "
                     f"{100 * gw['zero_std_frac']:.0f}%")
    ex = s.get("executed")
    if ex:
        lines.append("\nexecuted FLOPs (one more run per side under the counter, torch's per-op formulas; mean over "
                     "steps 2..N; LM head '-': a vocabulary too small to tell from other sizes):")
        lines.append(f"{'side':<10} {'GFLOP':>7} {'gen':>7} {'update':>7} {'LM head':>8} {'%peak':>6} {'%pk cpu':>7} "
                     f"{'gen GF/cpu s':>12} {'update GF/cpu s':>15}")
        for side in ("trl", "groupwise"):
            if side in ex:
                e = ex[side]
                head = f"{(e['generation_head'] + e['update_head']) / 1e9:.1f}" if e["head_told"] else "-"
                lines.append(f"{side:<10} {e['total'] / 1e9:>7.1f} {e['generation'] / 1e9:>7.1f} "
                             f"{e['update'] / 1e9:>7.1f} {head:>8} {100 * e['peak_frac']:>5.1f}% "
                             f"{100 * e['peak_frac_cpu']:>6.1f}% {e['gen_per_cpu_s'] / 1e9:>12.1f} "
                             f"{e['update_per_cpu_s'] / 1e9:>15.1f}")
        if "work_ratio" in ex:
            lines.append(f"TRL/groupwise CPU time {s['ratio_cpu_s']:.2f}x = executed work {ex['work_ratio']:.2f}x "
                         f"(TRL's FLOPs / groupwise's) x engine speed {ex['speed_ratio']:.2f}x (groupwise's "
                         "executed FLOPs per CPU second / TRL's)")
    paths = {r["decode_path"] for r in result["runs"] if r.get("decode_path", "not asked") != "not asked"}
    if paths:
        lines.append(f"groupwise decode path: {', '.join(sorted(paths))}")
    if not result["isolated"]:
        lines.append("note: both sides ran in one process (--in-process): RSS is that process's")
    for w in result["warnings"]:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- the core
def run(opts: Options, log=print, isolate: bool = True) -> dict:
    """Build the model directory, alternate the sides ``repeats`` times, probe the matmul peak, summarise.

    ``isolate=False`` runs both sides in this process (faster to start, used by the smoke test); peak RSS is
    then the process's, not each side's.
    """
    from importlib.metadata import version

    _use_src()

    if opts.group < 2:
        raise ValueError("--group must be >= 2 (TRL needs at least 2 generations per prompt)")
    workdir = Path(opts.workdir) if opts.workdir else Path(tempfile.mkdtemp(prefix="vs_trl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    info = make_model_dir(opts, workdir / "model")
    if opts.prefix_tokens:
        info["regime"] += f"; behind a {opts.prefix_tokens}-token system prompt (regime C)"
    if opts.shared_prefix is False:
        info["regime"] += "; groupwise unshared update (optim.shared_prefix=false)"
    elif opts.prefix_tokens:
        info["regime"] += ", groupwise optim.shared_prefix (its default)"
    if opts.fused_decode:
        info["regime"] += "; groupwise rollout.generator.decode=fused"
    if opts.gw:
        info["regime"] += "; groupwise " + " ".join(opts.gw)
    spec = {"model_dir": info["model_dir"], "task": info.get("task", TASK), "optim": info.get("optim", {}),
            "steps": opts.steps, "prompts": opts.prompts, "group": opts.group,
            "max_tokens": opts.max_tokens, "threads": opts.threads, "lr": opts.lr, "seed": opts.seed,
            "reward": opts.reward_kind, "workdir": str(workdir), "prefix_tokens": opts.prefix_tokens,
            "shared_prefix": opts.shared_prefix, "fused_decode": opts.fused_decode, "gw": list(opts.gw),
            "device": opts.device, "dtype": opts.dtype, "trl_micro_batch": opts.trl_micro_batch,
            "trl_generation": opts.trl_generation}
    if opts.trl_micro_batch:
        info["regime"] += (f"; TRL in micro-batches of {opts.trl_micro_batch} rows (gradient_accumulation_steps "
                           f"{opts.prompts * opts.group // opts.trl_micro_batch})")
    if opts.trl_generation == "continuous":
        info["regime"] += "; TRL use_transformers_continuous_batching"
    if opts.device != "cpu" or opts.dtype != "float32":
        info["regime"] += f"; on {opts.device} in {opts.dtype} (% peak: of the CPU fp32 probe)"
    probes = [matmul_peak(opts.matmul_n, opts.threads)]
    runs = []
    for r in range(opts.repeats):
        order = opts.sides if r % 2 == 0 else tuple(reversed(opts.sides))  # ABBA against drifting load
        for side in order:
            log(f"[repeat {r + 1}/{opts.repeats}] {side} ...")
            out = run_side(side, spec, workdir, f"{side}-{r}") if isolate else run_here(side, spec)
            out["repeat"] = r
            runs.append(out)
            timed = out["steps"][1:] or out["steps"]
            log(f"  median s/step {statistics.median(s['step_s'] for s in timed):.3f} wall, "
                f"{statistics.median(s['cpu_s'] for s in timed):.3f} CPU")
        probes.append(matmul_peak(opts.matmul_n, opts.threads))
    counted = []
    if opts.count_flops:  # one more run per side under the FLOP counter, not timed (decomposed attention is slower)
        for side in opts.sides:
            log(f"[counted] {side} ...")
            out = (run_side(side, {**spec, "count_flops": True}, workdir, f"{side}-counted") if isolate
                   else run_here(side, {**spec, "count_flops": True}))
            counted.append(out)
    peak = {k: max(p[k] for p in probes) for k in ("wall", "cpu")}
    result = {
        "options": dataclasses.asdict(opts), "reward": opts.reward_kind, "regime": info["regime"],
        "params": info["params"], "model_dir": info["model_dir"], "peak_flops": peak,
        "peak_probes": [p["wall"] for p in probes],
        "flop_formula": "2*N*sum(P+T) generation + 6*N*sum(P+T) training, N = parameters",
        "versions": {k: version(k) for k in ("torch", "transformers", "trl")}, "isolated": isolate,
        "runs": runs, "counted_runs": counted, "warnings": check_identical(runs) + check_counted(runs, counted),
    }
    result["summary"] = summarize(runs, info["params"], peak)
    if counted:
        result["summary"]["executed"] = executed_summary(result["summary"], counted, peak)
    return result


def parse(argv: list[str] | None = None) -> tuple[Options, str | None, bool]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Options()
    p.add_argument("--preset", default=None, choices=["lab-small", "lab-tiny"],
                   help=f"embedded model preset (default {d.preset})")
    p.add_argument("--steps", type=int, help=f"optimizer steps per side and repeat (default {d.steps})")
    p.add_argument("--prompts", type=int, help=f"prompts per step (default {d.prompts})")
    p.add_argument("--group", type=int, help=f"completions per prompt G (default {d.group})")
    p.add_argument("--max-tokens", type=int, help=f"completion cap (default {d.max_tokens})")
    p.add_argument("--threads", type=int, help=f"torch intra-op threads on both sides (default {d.threads})")
    p.add_argument("--repeats", type=int, help=f"runs per side, alternating (default {d.repeats})")
    p.add_argument("--warm-start", action="store_true", help="SFT warm start: completions stop at EOS")
    p.add_argument("--warm-start-steps", type=int, help=f"SFT steps (default {d.warm_start_steps}, cached)")
    p.add_argument("--warm-start-lr", type=float, help=f"SFT learning rate (default {d.warm_start_lr:g})")
    p.add_argument("--reward", choices=["auto", "correctness", "dense"],
                   help="auto: correctness with --warm-start, dense otherwise")
    p.add_argument("--lr", type=float, help=f"learning rate on both sides (default {d.lr})")
    p.add_argument("--seed", type=int)
    p.add_argument("--matmul-n", type=int, help=f"matrix size of the peak probe (default {d.matmul_n})")
    p.add_argument("--sides", help="comma-separated subset of trl,groupwise (default both)")
    p.add_argument("--workdir", help="keep the model, specs and per-side logs here (default: a temp dir)")
    p.add_argument("--json", metavar="OUT", help="write every per-step record and the summary as JSON")
    p.add_argument("--prefix-tokens", type=int,
                   help="regime C: every prompt behind the same system prompt of this many tokens (default 0)")
    p.add_argument("--shared-prefix", action=argparse.BooleanOptionalAction, default=None,
                   help="groupwise: optim.shared_prefix, each group's prompt once in the update (on by default; "
                   "--no-shared-prefix: every row runs its prompt)")
    p.add_argument("--fused-decode", action="store_true",
                   help="groupwise: rollout.generator.decode=fused (the default, auto, already runs the fused "
                   "decode where it can; fused warns where it falls back)")
    p.add_argument("--gw", action="append", metavar="KEY=VALUE",
                   help="a groupwise-only config override (repeatable), e.g. optim.skip_inert_rows=false")
    p.add_argument("--model", help="regime real: a pretrained model (a directory, a .gguf file, a hub id or "
                   "smollm2-135m-instruct); both sides train every weight")
    p.add_argument("--recipe",
                   help=f"regime real: the recipe whose task gives the problems (default {d.recipe})")
    p.add_argument("--device", help=f"both sides' device, e.g. cuda (default {d.device})")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help=f"both sides' dtype (default {d.dtype})")
    p.add_argument("--trl-micro-batch", type=int,
                   help="TRL's per_device_train_batch_size; the step's rows in micro-batches of this size "
                   "(gradient_accumulation_steps = rows / this); default: all rows in one micro-batch")
    p.add_argument("--trl-generation", choices=["generate", "continuous"],
                   help="TRL's generation: model.generate (default) or use_transformers_continuous_batching")
    p.add_argument("--count-flops", action="store_true",
                   help="one more run per side under a FLOP counter (not timed): executed FLOPs per step, their "
                   "share of the peak, and the ratio split into executed work x engine speed")
    p.add_argument("--quick", action="store_true", help="tiny settings for a seconds-long smoke run")
    p.add_argument("--in-process", action="store_true",
                   help="run both sides in this process (debugging; peak RSS is then not per side)")
    a = p.parse_args(argv)
    values = dict(QUICK) if a.quick else {}
    for f in dataclasses.fields(Options):
        v = getattr(a, f.name, None)
        if v is not None and f.name not in ("sides", "gw"):
            values[f.name] = v
    for flag in ("warm_start", "count_flops"):
        if getattr(a, flag):
            values[flag] = True
    if a.model and a.lr is None:
        values["lr"] = 1e-5  # a full fine-tuning lr for a pretrained model (the lab's 1e-4 is for a 0.8M toy)
    if a.fused_decode:
        values["fused_decode"] = True
    if a.gw:
        values["gw"] = tuple(a.gw)
    if a.sides:
        values["sides"] = tuple(s.strip() for s in a.sides.split(","))
        if not set(values["sides"]) <= set(SIDES):
            p.error("--sides: use trl, groupwise or both")
    return Options(**values), a.json, not a.in_process


def main(argv: list[str] | None = None) -> dict:
    opts, json_out, isolate = parse(argv)
    result = run(opts, log=lambda m: print(m, file=sys.stderr, flush=True), isolate=isolate)
    print(table(result))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child_main(*sys.argv[2:])
    else:
        main()
