"""FGRPO's federation: federated GRPO with relative-gain aggregation on non-IID clients (spec §14, arXiv 2606.03094).

A server holds the global trainable weights θ (every weight, or only the LoRA adapter with ``model.lora``) and
one EMA baseline per client. Each round r it broadcasts θ^r; client k loads it into its own pipeline (built
once with ``setup.build`` from the recipe plus its ``clients[k].task`` overrides, reused every round), runs
``local_steps`` (E) ``rl_step``s on its shard and returns Δ_k = θ_k − θ^r with its score P_k. The server
then aggregates (``aggregation``):

  fedavg   w_k = 1/n                                         (equal shards: every client has the same batch)
  reward   w_k = P_k / Σ_j P_j                               (raw-reward weighting; uniform when Σ P ≤ 0)
  fgrpo    g_k = (P_k − B_k) / (|B_k| + ε_g)                 relative gain against the client's own baseline
           w_k = (1 − ξ)·softmax_k(g_k / T) + ξ/n            temperature T, floor ξ (no client is starved)
  then     θ^{r+1} = θ^r + η_s Σ_k w_k Δ_k                   (η_s = ``server_lr``; 1: a weighted model average)
           B_k ← μ·B_k + (1 − μ)·P_k                         (EMA, μ = ``mu``; the first score initialises B_k,
                                                              so round 0 has g = 0 and uniform weights)

Choices (the spec marks every formula [design]):
  score        ``heldout`` (default): greedy accuracy of the client's locally trained model θ_k on a fixed local
               held-out slice (the last ``score_problems`` of its task's test split, disjoint from the first
               ``eval.n_problems`` the eval reads when they fit), times ``reward_scale``; ``train``: the mean
               training reward of the round's rollouts (the spec's cheap alternative). The spec's default scores
               the *previous* global model; scoring the local result is what a client can report with its delta.
  reward_scale multiplies every reward term's weight of that client (its verifier reward is then 0 or
               ``reward_scale``) and its held-out score. With std-normalised GRPO advantages the local update is
               scale-free; only the server's weights see the scale, which is what the arms compare.
  failures     a client whose round raises is left out of that round (the others are renormalised), its baseline
               is unchanged, and ``federated/client_failures`` counts it (cumulative); if all fail, θ stays.
  local state  each client keeps its optimizer (Adam moments), scheduler and stateful parts across rounds; with
               one client and E = 1 the run therefore equals centralised GRPO (weights, tested).
  steps        ``trainer.steps`` counts local steps per client: rounds = trainer.steps / E (must divide);
               metrics, ``trainer.save_every`` and ``eval.every`` use that step count (logged once per round).
  seeds        client k trains with seed ``seed + 1009·k`` (client 0: the recipe's seed).

Every client starts from the recipe's model: with a warm start (the embedded model's, or a pretrained model's
format warm-up), that of the recipe's own (base) task, built once and shared by all clients. Checkpoints
(``checkpoints/step_*``) hold the global model in Hugging Face format (``groupwise eval RUN`` evaluates it on the
base task) and, in the trainer state, the round, the baselines, the failure count and every client's optimizer,
scheduler and component state; ``--resume`` continues from the last saved round and reproduces the uninterrupted
run.

Backends share ``Client`` and the aggregation math: ``inprocess`` calls the clients in turn; ``flower`` runs the
same loop as a Flower ServerApp whose clients are a ClientApp on a local simulated federation
(``flower_app.py``; ``pip install 'groupwise[federated]'``). The driver itself (``fgrpo.py``) picks the backend.
Eval (before / every / after): the global model on each client's first ``eval.n_problems`` test problems,
``eval/c<k>/*`` per client plus ``eval/macro_*`` and ``eval/worst_*`` (``eval/mean_at_k`` is the macro mean@k).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from groupwise.config import RunConfig
from groupwise.lazy import no_grad, torch

if TYPE_CHECKING:  # the loop and the checkpoints are imported where a run uses them: reading a recipe needs
    from torch import Tensor  # only the configs above (docs/architecture.md, "The front door")

    from groupwise.loop.pipeline import Pipeline
    from groupwise.loop.session import Session

Weights = dict[str, "Tensor"]


# ------------------------------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientConfig:
    task: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Overrides of the recipe's task knobs for this client's shard (``{ops: "*"}``); same task name."""
    reward_scale: float = 1.0
    """Multiplies this client's reward terms and its reported score (> 0)."""

    def __post_init__(self) -> None:
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale={self.reward_scale}: allowed > 0")
        if "name" in self.task:
            raise ValueError("task.name: a client overrides the recipe task's knobs, not the task; allowed: the "
                             "recipe task's keys")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FGRPOConfig:
    REFUSES: ClassVar[dict[str, str]] = {
        "vllm": "each client keeps an in-process HF policy that loads the global weights every round",
        "ray": "each client builds its own shards; backend=flower distributes the clients instead",
        "torchrun": "the clients train in one process (or as Flower clients); launch it without torchrun",
        "async": "clients run synchronous local steps; use rollout.max_async_level: 0"}
    clients: tuple[ClientConfig, ...] = (ClientConfig(),)
    local_steps: int = 10
    """E: local GRPO steps per client per round; ``trainer.steps`` must be a multiple of it."""
    aggregation: Literal["fgrpo", "fedavg", "reward"] = "fgrpo"
    score: Literal["heldout", "train"] = "heldout"
    score_problems: int = 32
    mu: float = 0.8
    temperature: float = 0.1
    floor: float = 0.1
    eps: float = 1e-3
    server_lr: float = 1.0
    backend: Literal["inprocess", "flower"] = "inprocess"
    round_timeout_s: float | None = None
    """backend=flower: a client that has not answered a message (a round, an eval, a state query) in time is counted
    as failed for it and its process restarted; if no client answers a round, the run stops. Unset (the default):
    in time is within 5 x the longest wait for one reply of that kind so far, at least 120 s, of the previous
    reply (the clients answer one after another, so a wait is one client's round): a hang is found within a few
    of its rounds' time, in minutes. Before a kind was ever answered (the first round, the first eval) the wait
    is 1800 s; after a restart it may also take 5 x the longest client start-up (the clients rebuild).
    A number: the whole message's limit, in seconds; 0 waits forever. (``flower_app.auto_timeout``)"""

    def __post_init__(self) -> None:
        rules = [("clients", len(self.clients) >= 1, "at least one client"), ("local_steps", self.local_steps >= 1,
                 ">= 1"), ("score_problems", self.score_problems >= 1, ">= 1"), ("mu", 0 <= self.mu < 1, "in [0, 1)"),
                 ("temperature", self.temperature > 0, "> 0"), ("floor", 0 <= self.floor <= 1, "in [0, 1]"),
                 ("eps", self.eps >= 0, ">= 0"), ("server_lr", self.server_lr > 0, "> 0"),
                 ("round_timeout_s", self.round_timeout_s is None or self.round_timeout_s >= 0,
                  ">= 0 (0: no timeout; null, the default: from the measured replies)")]
        for key, ok, allowed in rules:
            if not ok:
                raise ValueError(f"{key}={getattr(self, key)!r}: allowed {allowed}")

    def check(self, run: RunConfig) -> None:
        if run.trainer.steps % self.local_steps:
            raise ValueError(f"trainer.steps={run.trainer.steps} is not a multiple of driver.local_steps="
                             f"{self.local_steps}; allowed: trainer.steps = rounds x local_steps")
        if self.backend == "flower" and importlib.util.find_spec("flwr") is None:
            raise ValueError("backend=flower needs flwr, which is not installed: pip install 'groupwise[federated]'; "
                             "allowed without it: backend=inprocess")
        for k in range(len(self.clients)):
            client_config(run, self, k)  # unknown or invalid task overrides fail here, naming the client


# ------------------------------------------------------------------------------------------ the math
def update_baseline(baseline: float | None, score: float, mu: float) -> float:
    """B ← μ·B + (1 − μ)·P; the first score initialises the baseline (B = P)."""
    return score if baseline is None else mu * baseline + (1 - mu) * score


def relative_gain(score: float, baseline: float | None, eps: float) -> float:
    """g = (P − B) / (|B| + ε_g); 0 without a baseline (the first round)."""
    return 0.0 if baseline is None else (score - baseline) / (abs(baseline) + eps)


def softmax(xs: Sequence[float], temperature: float) -> list[float]:
    m = max(xs)
    e = [math.exp((x - m) / temperature) for x in xs]
    return [v / sum(e) for v in e]


def aggregation_weights(mode: str, scores: Sequence[float], baselines: Sequence[float | None], *,
                        temperature: float = 0.1, floor: float = 0.1, eps: float = 1e-3) -> list[float]:
    """The weights of the clients that reported this round (non-negative, summing to 1); see the module doc."""
    n = len(scores)
    if mode == "fedavg":
        return [1.0 / n] * n
    if mode == "reward":
        total = sum(max(p, 0.0) for p in scores)
        return [max(p, 0.0) / total for p in scores] if total > 0 else [1.0 / n] * n
    gains = [relative_gain(p, b, eps) for p, b in zip(scores, baselines)]
    return [(1 - floor) * s + floor / n for s in softmax(gains, temperature)]


def apply_deltas(weights: Weights, deltas: Sequence[Weights], w: Sequence[float], server_lr: float) -> Weights:
    """θ + η_s Σ_k w_k Δ_k, per tensor (accumulated in float64, stored in each tensor's dtype)."""
    out = {}
    for name, theta in weights.items():
        step = sum(wk * d[name].double() for wk, d in zip(w, deltas))
        out[name] = (theta.double() + server_lr * step).to(theta.dtype)
    return out


@dataclasses.dataclass
class ServerState:
    """The server's state: global trainable weights, per-client baselines, round and failure counters."""

    weights: Weights
    baselines: list[float | None]
    round: int = 0
    failures: int = 0

    def aggregate(self, results: dict[int, ClientResult | BaseException], cfg: FGRPOConfig) -> dict[str, float]:
        """Fold one round's results into the state; returns the round's ``federated/*`` metrics."""
        ok = {k: r for k, r in sorted(results.items()) if isinstance(r, ClientResult)}
        self.failures += len(results) - len(ok)
        m = {"federated/client_failures": float(self.failures), "federated/clients_ok": float(len(ok))}
        if ok:
            scores = [r.score for r in ok.values()]
            w = aggregation_weights(cfg.aggregation, scores, [self.baselines[k] for k in ok],
                                    temperature=cfg.temperature, floor=cfg.floor, eps=cfg.eps)
            for (k, r), wk in zip(ok.items(), w):
                m.update({f"federated/weight_c{k}": wk, f"federated/score_c{k}": r.score,
                          f"federated/gain_c{k}": relative_gain(r.score, self.baselines[k], cfg.eps)})
                self.baselines[k] = update_baseline(self.baselines[k], r.score, cfg.mu)
                m[f"federated/baseline_c{k}"] = self.baselines[k]
            self.weights = apply_deltas(self.weights, [r.delta for r in ok.values()], w, cfg.server_lr)
        self.round += 1
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "baselines": list(self.baselines), "failures": self.failures}


# ------------------------------------------------------------------------------------------ clients
@dataclasses.dataclass
class ClientResult:
    delta: Weights
    score: float
    metrics: dict[str, float]


def trainable(model: torch.nn.Module) -> Weights:
    """The weights a round moves: every trainable parameter (with LoRA, the adapter's), detached copies."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@no_grad
def load_trainable(model: torch.nn.Module, weights: Weights) -> None:
    params = dict(model.named_parameters())
    for name, w in weights.items():
        params[name].copy_(w)


def client_config(run: RunConfig, cfg: FGRPOConfig, k: int, model_path: str | None = None) -> RunConfig:
    """Client k's recipe: the run's, with its task overrides, reward scale, seed and (when given) the shared
    initial model; its pipeline records no rollouts (``io=False``)."""
    c = cfg.clients[k]
    try:
        task_cfg = dataclasses.replace(run.task.cfg, **c.task)
    except TypeError:
        bad = next(key for key in c.task if key not in {f.name for f in dataclasses.fields(run.task.cfg)})
        allowed = ", ".join(f.name for f in dataclasses.fields(run.task.cfg))
        raise ValueError(f"clients.{k}.task.{bad}: unknown key for task '{run.task.name}'; "
                         f"allowed: {allowed}") from None
    except ValueError as e:
        raise ValueError(f"clients.{k}.task: {e}") from None
    terms = tuple(dataclasses.replace(t, weight=t.weight * c.reward_scale) for t in run.reward.terms)
    model = run.model if model_path is None else dataclasses.replace(run.model, path=model_path, warm_start=False)
    return dataclasses.replace(run, task=dataclasses.replace(run.task, cfg=task_cfg), seed=run.seed + 1009 * k,
                               reward=dataclasses.replace(run.reward, terms=terms), model=model,
                               driver=dataclasses.replace(run.driver, name="single", cfg=None))


def initial_model_path(run: RunConfig, task) -> str | None:
    """The model every client starts from: for a model with a warm start (embedded, or pretrained with
    ``model.warm_start: true``), that of the base task, which the server's build has just made or found in the
    cache: one warm-up for the run, where each client would otherwise build its own on its task (a different
    cache key)."""
    from groupwise.models.load import warm_start_dir

    path = warm_start_dir(run.model, task)
    return None if path is None else str(path)


class Client:
    """One data owner: its pipeline (built once) and what it does in a round."""

    def __init__(self, run: RunConfig, cfg: FGRPOConfig, k: int, model_path: str | None):
        self.k, self.fed = k, cfg
        from groupwise.loop.setup import build

        self.pipe: Pipeline = build(client_config(run, cfg, k, model_path), io=False)

    def load(self, weights: Weights) -> None:
        load_trainable(self.pipe.policy, weights)
        self.pipe.generator.sync_weights(self.pipe.policy)
        self.pipe.shards.sync_weights(self.pipe.policy)

    def train(self, weights: Weights, rnd: int) -> ClientResult:
        """E local steps from the global ``weights``; returns the delta, the score and the mean step metrics."""
        self.load(weights)
        e = self.fed.local_steps
        from groupwise.loop.trainer import rl_step

        steps = [rl_step(self.pipe, rnd * e + s) for s in range(e)]
        metrics = {key: (sum if key.startswith("perf/") else statistics.fmean)([m.get(key, 0.0) for m in steps])
                   for key in steps[-1]}
        scale = self.fed.clients[self.k].reward_scale
        if self.fed.score == "train":
            score = statistics.fmean(m.get("reward/mean", 0.0) for m in steps)
        else:
            score = scale * self.accuracy(self.pipe.task.test[-self.fed.score_problems:], k=1, temperature=0.0,
                                          greedy=False)["eval/mean_at_k"]
        now = trainable(self.pipe.policy)
        return ClientResult({n: now[n] - w for n, w in weights.items()}, score, metrics)

    def accuracy(self, problems, **kw) -> dict[str, float]:
        from groupwise.eval import evaluate_run

        return evaluate_run(self.pipe, problems, **kw)[0]

    def evaluate(self, weights: Weights) -> dict[str, float]:
        """The global model on this client's first ``eval.n_problems`` test problems."""
        self.load(weights)
        return self.accuracy(self.pipe.task.test[:self.pipe.cfg.eval.n_problems])

    def state_dict(self) -> dict[str, Any]:
        return self.pipe.trainer_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pipe.load_trainer_state(state)


class InProcess:
    """The federation in this process: every client's pipeline lives here, trained in turn."""

    def __init__(self, run: RunConfig, cfg: FGRPOConfig, model_path: str | None):
        self.clients = [Client(run, cfg, k, model_path) for k in range(len(cfg.clients))]

    def train(self, weights: Weights, rnd: int) -> dict[int, ClientResult | BaseException]:
        out: dict[int, ClientResult | BaseException] = {}
        for c in self.clients:
            try:
                out[c.k] = c.train(weights, rnd)
            except Exception as e:  # noqa: BLE001 - the round survives a failed client; counted by the server
                out[c.k] = e
        return out

    def evaluate(self, weights: Weights) -> dict[int, dict[str, float]]:
        return {c.k: c.evaluate(weights) for c in self.clients}

    def states(self) -> list[dict[str, Any]]:
        return [c.state_dict() for c in self.clients]

    def load_states(self, states: list[dict[str, Any]]) -> None:
        for c, s in zip(self.clients, states):
            if s is not None:  # None: a Flower client that failed before its state was ever saved
                c.load_state_dict(s)


# ------------------------------------------------------------------------------------------ the loop
def eval_metrics(per_client: dict[int, dict[str, float]]) -> dict[str, float]:
    """``eval/c<k>/*`` per client; ``eval/macro_*`` and ``eval/worst_*`` over clients (mean@k, greedy)."""
    out: dict[str, float] = {}
    for k, m in sorted(per_client.items()):
        out.update({f"eval/c{k}/{key[5:]}": v for key, v in m.items() if key in ("eval/mean_at_k", "eval/greedy_acc")})
    for key in ("mean_at_k", "greedy_acc"):
        vals = [m[f"eval/{key}"] for m in per_client.values() if f"eval/{key}" in m]
        if vals:
            out[f"eval/macro_{key}"], out[f"eval/worst_{key}"] = statistics.fmean(vals), min(vals)
    out["eval/mean_at_k"] = out.get("eval/macro_mean_at_k", 0.0)
    return out


def round_metrics(results: dict[int, ClientResult | BaseException]) -> dict[str, float]:
    """Client step metrics: mean over the clients that finished (``perf/*`` summed), plus per-client reward."""
    ok = [(k, r) for k, r in sorted(results.items()) if isinstance(r, ClientResult)]
    if not ok:
        return {}
    keys = ok[0][1].metrics
    out = {key: (sum if key.startswith("perf/") else statistics.fmean)([r.metrics.get(key, 0.0) for _, r in ok])
           for key in keys}
    out.update({f"federated/c{k}/reward_correct": r.metrics.get("reward/correct_frac", 0.0) for k, r in ok})
    return out


@dataclasses.dataclass
class Loop:
    """The federated loop around any federation (``InProcess`` or Flower's): rounds, logging, eval, saves."""

    run: RunConfig
    cfg: FGRPOConfig
    session: Session
    server: Pipeline
    state: ServerState
    on_round: Callable[[int], None] | None = None  # a test hook (after each round's save)

    def evaluate(self, fed, step: int) -> dict[str, float]:
        per_client = fed.evaluate(self.state.weights)  # Flower: the clients that answered
        m = {**eval_metrics(per_client), "eval/clients": float(len(per_client))}
        assert self.session.logger is not None
        self.session.logger.log(step, m)
        self.session.progress.note(f"eval step {step}: macro mean@k {m.get('eval/macro_mean_at_k', 0):.3f}  "
                                   f"worst {m.get('eval/worst_mean_at_k', 0):.3f}")
        return m

    def save(self, fed, step: int) -> None:
        load_trainable(self.server.policy, self.state.weights)
        state = {**self.server.trainer_state(), "counters": dict(self.session.counters),
                 "federated": {**self.state.state_dict(), "clients": fed.states()}}
        from groupwise import checkpoint as ckpt

        ckpt.save(self.run.run_dir, step, self.server.policy, self.server.tokenizer, state,
                  self.run.trainer.keep_last)

    def __call__(self, fed) -> dict[str, dict[str, float]]:
        e, run, session, result = self.cfg.local_steps, self.run, self.session, {}
        step = self.state.round * e
        if step == 0 and run.eval.before:
            result["before"] = self.evaluate(fed, 0)
        with session.signals():
            while step < run.trainer.steps and not session.stopping:
                results = fed.train(self.state.weights, self.state.round)
                metrics = {**round_metrics(results), **self.state.aggregate(results, self.cfg)}
                prev, step = step, step + e
                session.record(step, metrics)
                result["last"] = metrics
                if run.eval.every and step // run.eval.every > prev // run.eval.every and step < run.trainer.steps:
                    self.evaluate(fed, step)
                if run.trainer.save_every and step // run.trainer.save_every > prev // run.trainer.save_every:
                    self.save(fed, step)
                if self.on_round is not None:
                    self.on_round(self.state.round)
        return self.finish(fed, step, result)

    def finish(self, fed, step: int, result: dict) -> dict[str, dict[str, float]]:
        from groupwise import checkpoint as ckpt

        last = ckpt.latest(self.run.run_dir)
        if last is None or last.name != f"step_{step:07d}":
            self.save(fed, step)
        if self.session.stopping:
            self.session.progress.note(f"interrupted: saved step {step}; resume with --resume")
            self.session.close()
            raise KeyboardInterrupt
        if self.run.eval.after:
            result["after"] = self.evaluate(fed, step)
        self.session.close(result)
        return result


def start(run: RunConfig, resume: bool, overwrite: bool, cfg: FGRPOConfig) -> tuple[Loop, list | None, str | None]:
    """Open the session and the server (the global model, resumed from the newest checkpoint); returns the loop,
    the clients' saved states (None on a fresh run) and the path every client's model starts from."""
    from groupwise import checkpoint as ckpt
    from groupwise.loop.session import Session
    from groupwise.loop.setup import build

    session = Session(run, resume, overwrite)
    base = dataclasses.replace(run, driver=dataclasses.replace(run.driver, name="single", cfg=None))
    server = build(base, session.checkpoint, screen=session.progress)
    session.restore(server)
    state = ServerState(trainable(server.policy), [None] * len(cfg.clients))
    clients = None
    if session.checkpoint is not None:
        fed = ckpt.load_state(session.checkpoint)["federated"]
        state.round, state.baselines, state.failures = fed["round"], list(fed["baselines"]), fed["failures"]
        clients = fed["clients"]
    return Loop(run, cfg, session, server, state), clients, initial_model_path(run, server.task)
