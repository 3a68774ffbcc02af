"""Agon (methods/agon.py, rewards/agon.py): the reward ladder, role rotation, the summary, the shared-opponent
degeneracy, the neutral setting (the drafter's stream is exactly the single driver's GRPO), compute accounting,
both player layouts, checkpoint / resume of both players, and the load-time refusals."""

import json
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from groupwise import api
from groupwise.catalog import support
from groupwise.config import load
from groupwise.drivers import DRIVERS
from groupwise.loop.setup import reward_terms
from groupwise.methods import agon as ag
from groupwise.registry import BuildEnv, ConfigError
from groupwise.rewards.stage import RewardStage
from groupwise.standard.grpo import GRPOConfig, grpo
from groupwise.standard.lab import Lab, LabConfig
from groupwise.types import Group, Problem, Sample

RECIPE = str(Path(__file__).parents[2] / "recipes" / "agon_lab.yaml")
# the demo's lab setting (its warm start ships with the package), small and short
SMALL = ["task.min_steps=3", "task.max_steps=3", "rollout.prompts_per_step=4", "rollout.group_size=4",
         "rollout.max_completion_tokens=40", "trainer.threads=1", "trainer.progress=false", "trainer.sinks=[jsonl]",
         "eval.before=false", "eval.after=false", "eval.every=0", "trainer.save_every=2", "trainer.record_groups=0"]
GOOD = "<think>3+5=8;8+2=0;0+7=7;so 7.</think><answer>7</answer>"  # 3+5+2+7 mod 10 = 7
BAD = "<think>3+5=8;8+2=1;1+7=8;so 8.</think><answer>8</answer>"


def sample(text: str) -> Sample:
    return Sample(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(1),
                  torch.ones(1, dtype=torch.bool), "stop", text=text)


def lab_stage() -> RewardStage:
    """The recipe's reward stage (correctness 2, format 0.5) on the lab."""
    lab = Lab(LabConfig(ops="+", min_steps=3, max_steps=3))
    cfg = load(RECIPE)
    return RewardStage(lab, reward_terms(cfg.reward.terms, BuildEnv(run=cfg, task=lab)), 5.0)


def grading(verdicts: dict, weight: float = 1.0):
    return ag._RivalGrading(lab_stage(), weight, verdicts)


PROBLEM = Problem(id="p", prompt="3+5+2+7", answer="7")


# ----------------------------------------------------------------------------------------- formulas
def test_reward_ladder_0_2_3_with_lambda_half():
    # R(b) = 2 c(b) + c(b)(1 − c(a)) + 0.5 φ(b); every text here is well formed (φ = 1), "junk" is not (φ = 0)
    cases = [(False, BAD, 0.0 + 0.5), (True, BAD, 0.0 + 0.5), (True, GOOD, 2.0 + 0.5), (False, GOOD, 3.0 + 0.5),
             (False, "junk", 0.0)]
    g = Group(PROBLEM, [sample(t) for _, t, _ in cases])
    grading({id(s): a for s, (a, _, _) in zip(g.samples, cases)})([g], 0)
    assert_close(torch.tensor(g.rewards), torch.tensor([r for _, _, r in cases]), rtol=0, atol=1e-12)
    assert [s.reward_terms["agon_rival"] for s in g.samples] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert [ag.rival_bonus(b, a) for a, b in ((0, 0), (1, 0), (1, 1), (0, 1))] == [0.0, 0.0, 0.0, 1.0]
    # rival_weight w: the top rung is 2 + w (w = 0.25: 2.25 + 0.5 format)
    h = Group(PROBLEM, [sample(GOOD)])
    grading({id(h.samples[0]): False}, 0.25)([h], 0)
    assert h.rewards == [2.75]


def test_the_drafters_reward_never_depends_on_the_challenger():
    # no rival verdict (the drafter's samples, a cooperative challenger's): R = 2 c + 0.5 φ, no rival term
    g = Group(PROBLEM, [sample(GOOD), sample(BAD)])
    grading({})([g], 0)
    assert g.rewards == [2.5, 0.5]
    assert all("agon_rival" not in s.reward_terms for s in g.samples)


def test_role_rotation_by_step_parity():
    assert [ag.roles(t, True) for t in range(4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert [ag.roles(t, False) for t in range(4)] == [(0, 1)] * 4
    streams = {p: {ag.roles(t, True).index(p) for t in (0, 1)} for p in (0, 1)}  # 0 = drafts, 1 = challenges
    assert streams == {0: {0, 1}, 1: {0, 1}}  # over two steps each player trains on both streams


def test_the_summary_hides_the_final_step_and_answer():
    assert ag.lab_steps(GOOD) == "<think>3+5=8;8+2=0;"
    s = ag.lab_steps(GOOD)
    assert "0+7=7" not in s and "so" not in s and "<answer>" not in s and "7" not in s  # the answer is 7
    assert ag.lab_steps("<answer>7</answer>") == "<think>" and ag.lab_steps("<think>3+5=8;so 8.</think>") == "<think>"


def test_the_running_totals_summary_hides_the_last_step_the_check_and_the_answer():
    draft = "5 - 2 = 3. 3 - 10 = -7. -7 - 1 = -8. Check: -7 - 1 = -8. The final answer is \\boxed{-8}."
    assert ag.running_totals(draft) == "5 - 2 = 3. 3 - 10 = -7."  # the answer -8 is the last step's total
    assert ag.running_totals("9 - 4 = 5. Check: 9 - 4 = 5. The final answer is \\boxed{5}.") == ""  # one step
    assert ag.running_totals("The final answer is \\boxed{5}.") == ""
    no_check = "1 + 2 = 3. 3 + 4 = 7. 7 + 1 = 8. The final answer is \\boxed{8}."
    assert ag.running_totals(no_check) == "1 + 2 = 3. 3 + 4 = 7."
    assert "running_totals" in ag.SUMMARIES and ag.AgonConfig(summary="running_totals").summary == "running_totals"


def test_shared_opponent_bonus_vanishes_under_group_standardisation():
    # every b_i of a group reads the same a_1: R_comp = (3 − c(a)) c(b) = k · R_coop with k = 3/2 or 1
    c_b = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    coop = torch.tensor([[2 * c for c in c_b]] * 2, dtype=torch.float64)
    comp = torch.tensor([[2 * c + ag.rival_bonus(c, a) for c in c_b] for a in (False, True)], dtype=torch.float64)
    from groupwise.types import ScoredBatch

    def adv(r, eps):
        m = torch.ones_like(r, dtype=torch.bool)
        return grpo(ScoredBatch([], r, m, r, m), GRPOConfig(eps=eps))

    assert_close(adv(comp, 0.0), adv(coop, 0.0), rtol=0, atol=1e-12)  # exactly, up to round-off
    assert torch.equal(adv(comp, 1e-4)[1], adv(coop, 1e-4)[1])  # c(a) = 1: no bonus at all
    # with eps: (3x − 3m)/(3s + eps) vs (2x − 2m)/(2s + eps), s = std(c_b) = sqrt(0.3): within ~1e-4
    assert (adv(comp, 1e-4) - adv(coop, 1e-4)).abs().max() < 1e-4


def test_opponents_per_rollout_or_shared():
    g = Group(PROBLEM, [sample(GOOD), sample(BAD), sample(BAD)])
    assert ag._Rival([g], "competitive", ag.lab_steps).opponents(g, 3) == g.samples
    assert ag._Rival([g], "shared_opponent", ag.lab_steps).opponents(g, 3) == [g.samples[0]] * 3


# ------------------------------------------------------------------------------------------ runs
def rows(run: Path) -> list[dict]:
    out = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and "perf/" not in k} for r in out if "step" in r]


def train(tmp: Path, name: str, *extra: str, resume: bool = False) -> tuple[dict, Path]:
    cfg = load(RECIPE, [*SMALL, f"out_dir={tmp}", f"name={name}", *extra])
    return api.run(cfg, resume=resume, overwrite=not resume), cfg.run_dir


def test_neutral_setting_the_drafter_is_exactly_the_single_driver(tmp_path):
    # rotate_roles: false -> player A drafts every step: its stream is plain GRPO on R = 2c + 0.5 φ, the same
    # problems, seeds and updates as the single driver on the same recipe
    _, single = train(tmp_path, "single", "trainer.steps=3", "driver=single")
    _, agon = train(tmp_path, "agon", "trainer.steps=3", "driver.rotate_roles=false")
    want, got = rows(single), rows(agon)
    assert len(want) == len(got) == 3
    for w, g in zip(want, got):
        mine = {k.removeprefix("drafter/"): v for k, v in g.items() if k.startswith("drafter/")}
        assert mine == {k: v for k, v in w.items() if k != "step"}
        assert g["agon/drafter"] == 0.0
    assert any(w["loss/total"] != 0 for w in want)  # not vacuous: the updates did something


def test_rotation_token_accounting_and_eval(tmp_path):
    result, run = train(tmp_path, "rot", "trainer.steps=2", "eval.after=true", "eval.n_problems=8")
    got = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in got if "agon/drafter" in r]
    assert [r["agon/drafter"] for r in steps] == [0.0, 1.0]
    for r in steps:
        assert r["perf/gen_tokens"] == r["drafter/perf/gen_tokens"] + r["challenger/perf/gen_tokens"]
        assert r["drafter/rollout/samples"] == r["challenger/rollout/samples"] == 16
        assert "challenger/reward/agon_rival" in r and "drafter/reward/agon_rival" not in r
        assert r["challenger/reward/agon_rival"] == r["agon/rival_bonus_frac"]
    after = result["after"]
    assert {"eval/cascade_ab_acc", "eval/cascade_ba_acc", "eval/solo_a_acc", "eval/solo_b_acc"} <= set(after)
    assert len((run / "eval" / "step_2.jsonl").read_text().splitlines()) == 16  # 8 problems x 2 directions


def test_cooperative_grades_no_rival(tmp_path):
    _, run = train(tmp_path, "coop", "trainer.steps=1", "driver.mode=cooperative")
    (r,) = rows(run)
    assert "challenger/reward/agon_rival" not in r and "agon/rival_bonus_frac" in r


def test_resume_restores_both_players_exactly(tmp_path):
    _, ref = train(tmp_path, "ref", "trainer.steps=4")
    _, run = train(tmp_path, "cut", "trainer.steps=2")
    train(tmp_path, "cut", "trainer.steps=4", resume=True)
    assert rows(run) == [{**r} for r in rows(ref)] and len(rows(ref)) == 4
    assert any(r["challenger/loss/total"] != 0 for r in rows(ref))


def test_resume_uses_the_newest_step_both_players_saved(tmp_path):
    # a kill between the two players' saves: B's newest checkpoint is missing, both resume from the step before
    _, ref = train(tmp_path, "ref", "trainer.steps=4")
    _, run = train(tmp_path, "cut", "trainer.steps=4")
    (run / "metrics.jsonl").write_text("".join(x + "\n" for x in (run / "metrics.jsonl").read_text().splitlines()[:3]))
    import shutil

    shutil.rmtree(run / "players" / "b" / "checkpoints" / "step_0000004")
    assert ag.common_step([ag.player_cfg(load(RECIPE, [*SMALL, f"out_dir={tmp_path}", "name=cut"]), i)
                           for i in range(2)], print) == 2
    train(tmp_path, "cut", "trainer.steps=4", resume=True)
    assert rows(run) == rows(ref)


def test_two_lora_adapters_on_one_base(tmp_path):
    extra = ["driver.players=lora", "model.lora={r: 4, alpha: 8}", "optim.lr=1e-3"]
    cfg = load(RECIPE, [*SMALL, f"out_dir={tmp_path}", "name=lora", *extra])
    players, step, _ = ag.open_players(cfg, cfg.driver.cfg, resume=False, note=print)
    a, b = (p.pipe.policy for p in players)
    shared = [n for n, t in a.named_parameters() if not t.requires_grad]  # the frozen base
    pb = dict(b.named_parameters())
    assert shared and all(pb[n] is t for n, t in a.named_parameters() if n in shared)
    ups_a = [t for n, t in a.named_parameters() if "lora_B" in n]
    ups_b = [t for n, t in b.named_parameters() if "lora_B" in n]
    assert all(bool((t == 0).all()) for t in ups_a) and all(bool((t != 0).any()) for t in ups_b)
    _, run = train(tmp_path, "lora2", "trainer.steps=2", *extra)
    train(tmp_path, "lora2", "trainer.steps=3", *extra, resume=True)
    assert [r["step"] for r in rows(run)] == [1, 2, 3]
    assert (run / "players" / "b" / "checkpoints" / "step_0000003" / "model" / "adapter_config.json").is_file()


# ------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("extra, message", [
    (["driver.players=lora"], r"^driver 'agon': players=lora needs model.lora .*; allowed: .*$"),
    (["model.lora={r: 4}"], r"^driver 'agon': players=full trains two full copies, but model.lora is set; "),
    (["driver.rival_weight=-1"], r"rival_weight=-1"),
    (["filter=zero_variance"], r"^driver: driver 'agon' cannot run with filter 'zero_variance' \(filter\): both "
                               r"'drops_groups'; allowed: one of them$"),
    (["driver.mode=rivalry"], r"driver.mode.*rivalry"),
    (["rollout.generator=vllm"], r"^driver: driver 'agon' does not run with vllm: two players would need"),
])
def test_load_errors_are_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as e:
        load(RECIPE, extra)
    assert "\n" not in str(e.value)


def test_the_support_row():
    row = support(DRIVERS.get("agon"))
    assert row["vllm"].startswith("no: ") and row["ray"].startswith("no: ")
