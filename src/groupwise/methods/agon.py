"""``agon``: two players that compete, with implicit rival grading (Agon, arXiv 2607.07690; docs/methods.md).

Two policies A and B, each a full ``setup.build`` pipeline of the recipe (its own optimizer, scheduler,
selector, replay and component state). Per step t:

  roles      ``(drafter, challenger) = (A, B)`` if t is even else ``(B, A)`` (``rotate_roles: false``: A always
             drafts), so over two steps each player trains on both streams
  draft      ``rl_step(drafter, t)``: the drafter's own selector, builder and reward, unchanged: N rollouts
             ``a_1..a_N`` per problem, reward ``2 c(a) + λ φ(a)`` (no opponent term), its own GRPO group, its own
             update. The driver only keeps the scored groups (``_Tap`` wraps the builder)
  challenge  ``rl_step(challenger, t)`` on a view of the challenger's pipeline whose selector serves the same
             problems (``_Feed``), whose builder (``_Rival``) samples one ``b_i`` per draft ``a_i``, reading
             ``summary(a_i)``: the draft's written work with the final answer hidden, forced into the
             challenger's context (prefilled, not trained on), and whose reward stage (``_RivalGrading``) is the
             recipe's plus the rival term ``rival_weight · c(b_i)(1 − c(a_i))`` (``reward_terms["agon_rival"]``).
             With the recipe's ``correctness: 2`` and ``format: λ`` and ``rival_weight: 1`` the challenger's reward
             is ``2 c(b) + c(b)(1 − c(a)) + λ φ(b)``: the ladder (c(a), c(b)) → (0,0) 0, (1,0) 0, (1,1) 2,
             (0,1) 3 before the format term (λ = 0.5 in recipes/agon_lab.yaml). The product, not the margin
             ``c(b) − c(a)``: the margin adds a term independent of the challenger's action (no expected
             gradient); the product reweights its correctness by opponent failure, which needs opponents that
             differ within the group

``rl_step`` itself is unchanged and has no branch on the mode: the arms are driver knobs.

  mode       ``competitive`` (the paper; per-rollout opponents), ``cooperative`` (the challenger reads the draft
             but gets no rival verdict: ``2 c(b) + λ φ(b)``) or ``shared_opponent`` (every ``b_i`` of a group
             reads the group's first draft ``a_1``: the bonus is a constant multiple of c(b), which group
             standardisation removes; the spec's degeneracy ablation)
  players    ``full``: two full copies (B = A's initial weights plus N(0, perturb_std²) noise on every trained
             weight, drawn from seed + 1) or ``lora``: one base and two peft adapters (``model.lora``), A's
             up-matrix zero (the base at step 0), B's up-matrix N(0, perturb_std²); B's frozen base weights are
             A's own tensors (one base in memory). B's pipeline runs with seed + 1 (its own sampling streams)

Summary (``summary``, pluggable in ``SUMMARIES``): ``steps`` (the lab's): ``<think>`` plus the draft's step lines
but the last one (whose result is the answer), without the ``so X.`` commitment and the answer tag;
``running_totals`` (reasoning-gym chains written as running totals, the real-model lab): the step sentences but
the last one, without the re-check and the boxed answer. The challenger continues from there. Neutral setting:
the drafter's stream is exactly GRPO, so with ``rotate_roles: false`` player A's every step equals the ``single``
driver's on the same recipe (tests/unit/test_agon.py checks it metric for metric).

Inference and eval: the two-stage cascade, greedy (pass@1): the drafter answers the plain prompt, the
challenger reads its summary and answers. Both directions (``eval/cascade_ab_acc``: A drafts, B answers;
``eval/cascade_ba_acc``) and each player alone (``eval/solo_a_acc``, ``eval/solo_b_acc``) are reported; no
direction is picked on the test set. ``eval/cascade_*_len`` is the challenger stage's own length (tokens after
the summary).

Run directory: ``metrics.jsonl`` (per step, ``drafter/<metric>`` and ``challenger/<metric>`` by role,
``agon/*``, summed ``perf/gen_tokens`` and ``perf/step_s``; ``reward/mean``, ``reward/correct_frac`` and
``rollout/completion_len_mean`` are the two streams' means, for the progress line), ``summary.json``,
``eval/``, and per player ``players/<a|b>/`` with its own checkpoints (``checkpoints/step_*``: weights or
adapter, optimizer, scheduler, component state, the run's counters) and resolved config, so
``groupwise eval RUN/players/a`` evaluates one player alone. Both players are saved at the same step, each
keeping ``keep_last + 1`` checkpoints, so a kill between the two saves leaves a common step; ``--resume``
restores both from the newest step intact for both (the roles and the schedule are a function of the step).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import yaml

from groupwise.config import RunConfig, to_dict
from groupwise.drivers import DRIVERS, DriverRun
from groupwise.lazy import no_grad, torch
from groupwise.log import Logger, write_atomic
from groupwise.rollout.base import Request, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.types import Group, Problem

if TYPE_CHECKING:  # the loop and the checkpoints are imported where a run uses them: reading a recipe needs only
    from groupwise.loop.pipeline import Pipeline  # AgonConfig (docs/architecture.md, "The front door")
    from groupwise.loop.session import Session

NAMES = ("a", "b")
RIVAL = "agon_rival"
"""The rival term's label in ``Sample.reward_terms`` (metric ``challenger/reward/agon_rival``)."""


def rival_bonus(correct: bool, rival_correct: bool) -> float:
    """``c(b) · (1 − c(a))``: 1 when the challenger is right where the draft it read was wrong, else 0."""
    return float(correct) * (1.0 - float(rival_correct))


def lab_steps(text: str) -> str:
    """The lab draft's written work with the final answer hidden: ``<think>`` and every complete step line but
    the last (``<think>3+5=8;8-2=6;6+7=3;so 3.</think><answer>3</answer>`` → ``<think>3+5=8;8-2=6;``)."""
    body = text.split("<think>", 1)[1] if "<think>" in text else ""
    body = body.split("</think>", 1)[0].split("so ", 1)[0]
    steps = body.split(";")[:-1]  # the complete steps (each ends with ';')
    return "<think>" + "".join(s + ";" for s in steps[:-1])


_TOTAL = re.compile(r"[^.]*?= *-?\d+\.")
"""One step sentence of a running-totals draft, ending with its total (``3 - 10 = -7.``)."""


def running_totals(text: str) -> str:
    """A running-totals draft (reasoning-gym chains, ``task.reference: running_totals_check``) with its final answer
    hidden: every step sentence ``a ± b = c.`` but the last one (whose total is the answer), without the re-check
    and the boxed answer (``5 - 2 = 3. 3 - 10 = -7. -7 - 1 = -8. Check: -7 - 1 = -8. The final answer is
    \\boxed{-8}.`` → ``5 - 2 = 3. 3 - 10 = -7.``; a one-step draft → ``""``, the challenger solves it alone)."""
    body = re.split(r"\s*(?:Check:|The final answer)", text, maxsplit=1)[0]
    steps = _TOTAL.findall(body)
    return " ".join(s.strip() for s in steps[:-1])


SUMMARIES: dict[str, Callable[[str], str]] = {"steps": lab_steps, "running_totals": running_totals}
"""How a draft is shown to the challenger (the spec keeps ``summary_fn`` pluggable)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgonConfig:
    REFUSES: ClassVar[dict[str, str]] = {
        "vllm": "two players would need two engines or per-request adapter switching; use rollout.generator: hf",
        "ray": "the challenger's builder reads the drafts in the training process; use rollout.workers: 0",
        "torchrun": "the two players train in one process; launch it without torchrun / accelerate",
        "async": "the two players' steps interleave; use rollout.max_async_level: 0"}
    mode: Literal["competitive", "cooperative", "shared_opponent"] = "competitive"
    rotate_roles: bool = True
    """Alternate the roles every step (false: player A always drafts, B always challenges)."""
    players: Literal["full", "lora"] = "full"
    """``full``: two full copies; ``lora``: one base and two peft adapters (needs ``model.lora``)."""
    perturb_std: float = 1e-3
    """Std of player B's initial noise (full: on every weight; lora: on its adapter's up-matrix)."""
    summary: str = "steps"
    rival_weight: float = 1.0
    """Weight of the rival term ``c(b)(1 − c(a))``; with ``correctness`` weighted 2, 1 gives the ladder {0, 2, 3}
    (the paper's)."""

    def __post_init__(self) -> None:
        if self.mode not in ("competitive", "cooperative", "shared_opponent"):
            raise ValueError(f"mode={self.mode!r}; allowed: competitive, cooperative, shared_opponent")
        if self.players not in ("full", "lora"):
            raise ValueError(f"players={self.players!r}; allowed: full, lora")
        if not 0 <= self.rival_weight < float("inf"):
            raise ValueError(f"rival_weight={self.rival_weight}; allowed: >= 0 and finite")
        if self.perturb_std < 0:
            raise ValueError(f"perturb_std={self.perturb_std}; allowed: >= 0")
        if self.summary not in SUMMARIES:
            raise ValueError(f"summary={self.summary!r}; allowed: {', '.join(SUMMARIES)}")

    def check(self, cfg: RunConfig) -> None:
        """Against the rest of the recipe (each a one-line load error naming the key)."""
        if self.players == "lora" and cfg.model.lora is None:
            raise ValueError("players=lora needs model.lora (the adapters' r, alpha, target_modules); allowed: set "
                             "model.lora, or players: full")
        if self.players == "full" and cfg.model.lora is not None:
            raise ValueError("players=full trains two full copies, but model.lora is set; allowed: players: lora, "
                             "or drop model.lora")
        if cfg.rollout.transforms:
            raise ValueError("rollout.transforms would rebuild the challenger's groups without the drafts; "
                             "allowed: []")


# ------------------------------------------------------------------------------ the step's builders
class _Tap:
    """The drafter's own builder, keeping the groups it builds (scored in place right after, by the loop)."""

    def __init__(self, inner):
        self.inner, self.groups = inner, []

    def __call__(self, problems: list[Problem], ctx) -> list[Group]:
        groups = self.inner(problems, ctx)
        self.groups.extend(groups)
        return groups


class _Feed:
    """The challenger's selector for one step: the drafter's problems, in order."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems

    def next(self, step: int, k: int, ctx) -> list[Problem]:
        return list(self.problems)


class _RivalGrading:
    """The challenger's reward stage for one step: the recipe's stage, then ``+ weight · c(b)(1 − c(a))`` on every
    sample that read a draft (``cooperative``: none did, so the reward is the recipe's alone)."""

    def __init__(self, stage, weight: float, verdicts: dict[int, bool]):
        self.stage, self.weight, self.verdicts = stage, weight, verdicts

    def __call__(self, groups: list[Group], step: int) -> None:
        self.stage(groups, step)
        for g in groups:
            for s in g.samples:
                if id(s) in self.verdicts:
                    v = rival_bonus(s.correct, self.verdicts[id(s)])
                    s.reward_terms[RIVAL] = v
                    s.reward += self.weight * v

    def __getattr__(self, name: str):  # check, metrics, ...: the recipe's stage
        return getattr(self.stage, name)


class _Rival:
    """The challenger's builder for one step: per problem, one sample per draft of its drafter group, each
    continuing from that draft's summary (a forced prefix: in context, not trained on)."""

    def __init__(self, drafts: list[Group], mode: str, summary: Callable[[str], str]):
        self.queue: dict[str, deque[Group]] = {}
        for g in drafts:
            self.queue.setdefault(g.problem.id, deque()).append(g)
        self.mode, self.summary, self.groups = mode, summary, []
        self.verdicts: dict[int, bool] = {}  # id(challenger sample) -> c(its draft), read by ``_RivalGrading``

    def opponents(self, group: Group, n: int) -> list:
        shared = self.mode == "shared_opponent"
        return [group.samples[0 if shared else j % len(group.samples)] for j in range(n)]

    def __call__(self, problems: list[Problem], ctx) -> list[Group]:
        rivals = [self.opponents(self.queue[p.id].popleft(), ctx.group_size) for p in problems]
        prefixes = [[ctx.tokenizer.encode(self.summary(a.text), add_special_tokens=False) for a in row]
                    for row in rivals]
        groups = ctx.sample_groups(problems, ctx.group_size, prefixes=prefixes, stage="agon_challenge")
        for g, row, pre in zip(groups, rivals, prefixes):
            for s, a, ids in zip(g.samples, row, pre):
                s.meta.update(agon_prefix_len=len(ids), agon_draft_correct=bool(a.correct))
                if self.mode != "cooperative":
                    self.verdicts[id(s)] = bool(a.correct)
        self.groups.extend(groups)
        return groups


def view(p: Pipeline, **parts) -> Pipeline:
    """``p`` with some stages replaced for one step (every other component, and all state, shared)."""
    from groupwise.loop import workers

    v = dataclasses.replace(p, **parts)
    v.shards = workers.InProcess(v)
    return v


def roles(step: int, rotate: bool) -> tuple[int, int]:
    """(drafter, challenger) player indices at ``step``: (0, 1) on even steps, (1, 0) on odd ones if rotating."""
    return (1, 0) if rotate and step % 2 else (0, 1)


# --------------------------------------------------------------------------------------- players
@dataclasses.dataclass
class Player:
    name: str
    cfg: RunConfig  # the recipe with this player's run directory and seed
    pipe: Pipeline

    @property
    def root(self) -> Path:
        return self.cfg.run_dir


def player_cfg(cfg: RunConfig, i: int) -> RunConfig:
    return dataclasses.replace(cfg, out_dir=str(cfg.run_dir / "players"), name=NAMES[i], seed=cfg.seed + i)


def common_step(cfgs: list[RunConfig], note) -> int | None:
    """The newest step with an intact checkpoint for every player (None: no such step)."""
    from groupwise import checkpoint as ckpt

    steps = []
    for c in cfgs:
        ckpt.clean_stale(c.run_dir)
        good = set()
        for path in ckpt.complete(c.run_dir):
            why = ckpt.damage(path)
            if why is None:
                good.add(int(path.name.split("_")[-1]))
            else:
                note(f"player {c.name}: not resuming from damaged {path.name}: {why}")
        steps.append(good)
    both = set.intersection(*steps) if steps else set()
    return max(both) if both else None


@no_grad
def perturb(policy: torch.nn.Module, std: float, seed: int, lora: bool) -> None:
    """Add N(0, std²) noise to the trained weights (with ``lora``: the adapter's up-matrices only)."""
    g = torch.Generator().manual_seed(stable_seed("agon-perturb", seed))
    for name, t in policy.named_parameters():
        if t.requires_grad and (not lora or "lora_B" in name):
            t.add_((torch.randn(t.shape, generator=g) * std).to(t.device, t.dtype))


def share_base(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Point B's frozen (non-adapter) weights at A's tensors: one base in memory under two adapters."""
    mine = {id(t): t for _, t in a.named_parameters(remove_duplicate=False)}
    by_name = dict(a.named_parameters(remove_duplicate=False))
    for mod_name, mod in b.named_modules():
        for pname, t in list(mod._parameters.items()):
            full = f"{mod_name}.{pname}" if mod_name else pname
            if t is not None and not t.requires_grad and id(t) not in mine and full in by_name:
                mod._parameters[pname] = by_name[full]


def open_players(cfg: RunConfig, acfg: AgonConfig, resume: bool, note) -> tuple[list[Player], int, dict]:
    """Build both players (from the common checkpoint on resume); returns (players, next step, counters)."""
    from groupwise import checkpoint as ckpt
    from groupwise.loop.session import CONFIG
    from groupwise.loop.setup import build

    cfgs = [player_cfg(cfg, i) for i in range(2)]
    step = common_step(cfgs, note) if resume else None
    players, counters = [], {"gen_tokens_total": 0.0, "wall_s_total": 0.0}
    for c in cfgs:
        path = ckpt.checkpoint_dir(c.run_dir) / f"step_{step:07d}" if step is not None else None
        c.run_dir.mkdir(parents=True, exist_ok=True)  # its own resolved config: `groupwise eval RUN/players/a`
        write_atomic(c.run_dir / CONFIG, yaml.safe_dump(to_dict(c), sort_keys=False))
        p = build(c, path)
        if path is not None:
            state = ckpt.load_state(path)
            p.load_trainer_state(state)
            counters = state["counters"]
        players.append(Player(c.name, c, p))
    lora = acfg.players == "lora"
    if lora:
        share_base(players[0].pipe.policy, players[1].pipe.policy)
    if step is None and acfg.perturb_std > 0:
        perturb(players[1].pipe.policy, acfg.perturb_std, cfg.seed + 1, lora)
    if step is not None:
        note(f"resuming both players from step {step}")
    return players, step or 0, counters


def save(players: list[Player], step: int, counters: dict, acfg: AgonConfig) -> None:
    from groupwise import checkpoint as ckpt

    for pl in players:
        state = {**pl.pipe.trainer_state(), "counters": dict(counters),
                 "agon": {"mode": acfg.mode, "rotate_roles": acfg.rotate_roles, "players": acfg.players}}
        ckpt.save(pl.root, step, pl.pipe.policy, pl.pipe.tokenizer, state, pl.cfg.trainer.keep_last + 1)


# ---------------------------------------------------------------------------------------- one round
def agon_step(players: list[Player], step: int, acfg: AgonConfig) -> dict[str, float]:
    """One step: the drafter's ``rl_step``, then the challenger's on the drafts; metrics by role."""
    from groupwise.loop.trainer import rl_step

    d, c = (players[i] for i in roles(step, acfg.rotate_roles))
    tap = _Tap(d.pipe.builder)
    draft = rl_step(view(d.pipe, builder=tap), step)
    rival = _Rival(tap.groups, acfg.mode, SUMMARIES[acfg.summary])
    grading = _RivalGrading(c.pipe.reward, acfg.rival_weight, rival.verdicts)
    chal = rl_step(view(c.pipe, selector=_Feed([g.problem for g in tap.groups]), builder=rival, reward=grading), step)
    out = {f"drafter/{k}": v for k, v in draft.items()} | {f"challenger/{k}": v for k, v in chal.items()}
    pairs = [(s.meta["agon_draft_correct"], s.correct) for g in rival.groups for s in g.samples]
    n = max(len(pairs), 1)
    out.update({"agon/drafter": float(roles(step, acfg.rotate_roles)[0]),
                "agon/draft_correct_frac": sum(a for a, _ in pairs) / n,
                "agon/challenge_correct_frac": sum(b for _, b in pairs) / n,
                "agon/rival_bonus_frac": sum(b and not a for a, b in pairs) / n,
                "perf/gen_tokens": draft.get("perf/gen_tokens", 0.0) + chal.get("perf/gen_tokens", 0.0),
                "perf/step_s": draft.get("perf/step_s", 0.0) + chal.get("perf/step_s", 0.0)})
    for key in ("reward/mean", "reward/correct_frac", "rollout/completion_len_mean"):  # both streams, for the
        out[key] = (draft.get(key, 0.0) + chal.get(key, 0.0)) / 2  # progress line
    out["perf/gen_tokens_per_s"] = out["perf/gen_tokens"] / max(out["perf/step_s"], 1e-9)
    return out


# ------------------------------------------------------------------------------------- the cascade
def _answer(p: Pipeline, problems: list[Problem], prefixes: list[list[int]], max_tokens: int,
            seed: int) -> list[tuple[str, bool, int]]:
    """Greedy answers of one player, each after its forced prefix: (text, correct, own tokens)."""
    reqs = [Request(p.encode(x), tuple(pre)) for x, pre in zip(problems, prefixes)]
    outs = p.generator.generate(reqs, SamplingParams(max_tokens, 0.0), torch.Generator().manual_seed(seed))
    out = []
    for x, pre, c in zip(problems, prefixes, outs):
        text = p.tokenizer.decode(c.completion_ids.tolist(), skip_special_tokens=True)
        try:
            ok = p.reward.check(x, text)
        except (Exception, SystemExit):  # noqa: BLE001 - a verifier failure is "not correct", never a crash
            ok = False
        out.append((text, ok, int(c.completion_ids.numel()) - len(pre)))
    return out


def cascade_eval(players: list[Player], cfg: RunConfig, acfg: AgonConfig) -> tuple[dict[str, float], list[dict]]:
    """Greedy pass@1 on the first ``eval.n_problems`` held-out problems: each player alone, and the cascade in
    both directions (the drafter answers, the challenger reads its summary and answers)."""
    problems = list(players[0].pipe.task.test[:cfg.eval.n_problems])
    cap = cfg.eval.max_completion_tokens or cfg.rollout.max_completion_tokens
    seed = stable_seed("agon-eval", cfg.seed)
    solo = [_answer(pl.pipe, problems, [[]] * len(problems), cap, seed) for pl in players]
    m: dict[str, float] = {}
    records: list[dict] = []
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    for i, name in enumerate(NAMES):
        m[f"eval/solo_{name}_acc"] = mean([ok for _, ok, _ in solo[i]])
        m[f"eval/solo_{name}_len"] = mean([n for _, _, n in solo[i]])
    for i, j in ((0, 1), (1, 0)):
        tok = players[j].pipe.tokenizer
        prefixes = [tok.encode(SUMMARIES[acfg.summary](t), add_special_tokens=False) for t, _, _ in solo[i]]
        out = _answer(players[j].pipe, problems, prefixes, cap, seed)
        tag = NAMES[i] + NAMES[j]
        m[f"eval/cascade_{tag}_acc"] = mean([ok for _, ok, _ in out])
        m[f"eval/cascade_{tag}_len"] = mean([n for _, _, n in out])
        records += [{"id": x.id, "cascade": tag, "draft": d[0], "draft_correct": d[1], "text": t, "correct": ok}
                    for x, d, (t, ok, _) in zip(problems, solo[i], out)]
    return m, records


def run_eval(players: list[Player], cfg: RunConfig, acfg: AgonConfig, session: Session, step: int) -> dict:
    metrics, records = cascade_eval(players, cfg, acfg)
    session.log_eval(step, f"step_{step}", metrics, records,
                     f"eval step {step}: cascade ab {metrics['eval/cascade_ab_acc']:.3f}  ba "
                     f"{metrics['eval/cascade_ba_acc']:.3f}  solo a {metrics['eval/solo_a_acc']:.3f}  "
                     f"b {metrics['eval/solo_b_acc']:.3f}")
    return metrics


# ------------------------------------------------------------------------------------------ the run
def _open(run: DriverRun, acfg: AgonConfig) -> tuple[Session, list[Player], int]:
    from groupwise.loop.session import Session

    cfg = run.cfg
    session = Session(cfg, run.resume, run.overwrite)
    if run.overwrite and not run.resume:
        shutil.rmtree(cfg.run_dir / "players", ignore_errors=True)
    players, step, counters = open_players(cfg, acfg, run.resume, session.progress.note)
    session.counters = counters
    session.logger = Logger(cfg.run_dir, cfg.trainer.sinks, to_dict(cfg), step if run.resume else None,
                            note=session.progress.note)
    session.progress.update(step, {})
    return session, players, step


def _saved(players: list[Player], step: int) -> bool:
    from groupwise import checkpoint as ckpt

    return all((last := ckpt.latest(pl.root)) is not None and last.name == f"step_{step:07d}" for pl in players)


# each challenger group answers one drafter group, so no filter may drop or refill groups
@DRIVERS.register("agon", AgonConfig, conflicts=("drops_groups",))
def agon(run: DriverRun, cfg: AgonConfig) -> dict[str, Any]:
    """Two competing players (module docstring); returns {"before", "after": cascade eval, "last": step metrics}."""
    acfg, cfg = cfg, run.cfg
    session, players, step = _open(run, acfg)
    result: dict[str, Any] = {}
    if step == 0 and cfg.eval.before:
        result["before"] = run_eval(players, cfg, acfg, session, 0)
    with session.signals():
        while step < cfg.trainer.steps and not session.stopping:
            t0 = time.perf_counter()
            metrics = agon_step(players, step, acfg)
            metrics["perf/round_s"] = time.perf_counter() - t0
            step += 1
            session.record(step, metrics)
            result["last"] = metrics
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.steps:
                run_eval(players, cfg, acfg, session, step)
            if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
                save(players, step, session.counters, acfg)
    if session.stopping or not _saved(players, step):
        save(players, step, session.counters, acfg)
    if session.stopping:
        session.progress.note(f"interrupted: saved step {step} of both players under {cfg.run_dir / 'players'}; "
                              "resume with --resume")
        session.close()
        raise KeyboardInterrupt
    if cfg.eval.after:
        result["after"] = run_eval(players, cfg, acfg, session, step)
    session.close(result)
    for pl in players:
        pl.pipe.generator.close()
    return result
