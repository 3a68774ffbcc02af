"""FGRPO (methods/fgrpo/driver.py): the aggregation math pinned by hand, the neutral setting (one client, E = 1 equals
centralised GRPO), load-time errors, a failed client survived and counted, and resume after a kill."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from groupwise import api
from groupwise.config import load
from groupwise.methods.fgrpo import federated as fgrpo
from groupwise.methods.fgrpo.federated import (
    ClientResult,
    FGRPOConfig,
    ServerState,
    aggregation_weights,
    apply_deltas,
    relative_gain,
    update_baseline,
)
from groupwise.registry import ConfigError

RECIPE = str(Path(__file__).parents[2] / "recipes" / "fgrpo_lab.yaml")
TINY = ["trainer.threads=1", "trainer.progress=false", "trainer.sinks=[jsonl]", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_completion_tokens=24", "model.warm_start_steps=20",
        "task.test_size=24", "eval.n_problems=8", "eval.k=1", "driver.score_problems=8",
        "reward.terms=[{name: length_penalty, max_length: 24}]"]  # lengths vary, so every step trains


# ------------------------------------------------------------------------------------------ the math
def test_ema_baseline_matches_its_closed_form():
    # first score initialises: B = 0.5; then B = 0.8·0.5 + 0.2·0.6 = 0.52; then 0.8·0.52 + 0.2·0.1 = 0.436
    b = update_baseline(None, 0.5, 0.8)
    assert b == 0.5
    b = update_baseline(b, 0.6, 0.8)
    assert b == pytest.approx(0.52, abs=1e-12)
    b = update_baseline(b, 0.1, 0.8)
    assert b == pytest.approx(0.436, abs=1e-12)
    # closed form B^r = μ^(r-1)·P0 + (1-μ)·Σ_{j=1}^{r-1} μ^(r-1-j)·P_j, here r = 3: 0.64·0.5 + 0.2·(0.8·0.6 + 0.1)
    assert b == pytest.approx(0.64 * 0.5 + 0.2 * (0.8 * 0.6 + 0.1), abs=1e-12)


def test_relative_gain_by_hand():
    # (0.6 - 0.5) / (0.5 + 1e-3) = 0.1 / 0.501
    assert relative_gain(0.6, 0.5, 1e-3) == pytest.approx(0.19960079840319361, abs=1e-12)
    assert relative_gain(0.3, -0.5, 1e-3) == pytest.approx(0.8 / 0.501, abs=1e-12)  # |B| in the denominator
    assert relative_gain(0.7, None, 1e-3) == 0.0  # no history yet


def test_fgrpo_weights_by_hand():
    # g = [0.1/0.501, 0] = [0.199600798..., 0]; g/T = [1.99600798..., 0]; e = exp(1.99600798...) = 7.359618...
    # softmax = [e/(e+1), 1/(e+1)] = [0.880377..., 0.119623...]; w = 0.9·softmax + 0.1/2
    w = aggregation_weights("fgrpo", [0.6, 0.3], [0.5, 0.3], temperature=0.1, floor=0.1, eps=1e-3)
    e = math.exp(0.1 / 0.501 / 0.1)
    assert e == pytest.approx(7.359618, abs=1e-6)
    assert w == pytest.approx([0.9 * e / (e + 1) + 0.05, 0.9 / (e + 1) + 0.05], abs=1e-12)
    assert w == pytest.approx([0.842340, 0.157660], abs=1e-6)
    assert sum(w) == pytest.approx(1.0, abs=1e-12)


def test_fedavg_and_raw_reward_weights_by_hand():
    assert aggregation_weights("fedavg", [0.9, 0.1, 5.0], [None, 1.0, 0.0]) == [1 / 3] * 3
    # raw rewards 2.0 (0.4 at x5) and 0.08 (0.4 at x0.2): 2/2.08 and 0.08/2.08
    assert aggregation_weights("reward", [2.0, 0.08], [None, None]) == pytest.approx([2 / 2.08, 0.08 / 2.08],
                                                                                      abs=1e-12)
    assert aggregation_weights("reward", [0.0, 0.0], [None, None]) == [0.5, 0.5]  # nothing to weight by


def test_equal_gains_reduce_fgrpo_to_fedavg():
    w = aggregation_weights("fgrpo", [0.6, 3.0, 0.12], [0.5, 2.5, 0.1], eps=0.0)  # every gain is 0.2
    assert w == pytest.approx([1 / 3] * 3, abs=1e-12)
    assert aggregation_weights("fgrpo", [0.2, 0.9], [None, None]) == [0.5, 0.5]  # round 0: no baselines


def test_scale_invariance_of_relative_gain_weights():
    base = aggregation_weights("fgrpo", [0.6, 0.3, 0.5], [0.5, 0.35, 0.5], eps=0.0)
    scaled = aggregation_weights("fgrpo", [0.6 * 5, 0.3, 0.5 * 0.2], [0.5 * 5, 0.35, 0.5 * 0.2], eps=0.0)
    assert scaled == pytest.approx(base, abs=1e-12)
    assert aggregation_weights("reward", [3.0, 0.3, 0.1], [None] * 3) != pytest.approx(
        aggregation_weights("reward", [0.6, 0.3, 0.5], [None] * 3))  # raw rewards are not scale-free


def test_temperature_limits_and_floor():
    scores, bases = [0.6, 0.5, 0.4], [0.5, 0.5, 0.5]  # gains ≈ +0.2, 0, -0.2
    assert aggregation_weights("fgrpo", scores, bases, temperature=1e9) == pytest.approx([1 / 3] * 3, abs=1e-9)
    # T → 0: one-hot on the largest gain, plus the floor ξ/n on everyone
    hot = aggregation_weights("fgrpo", scores, bases, temperature=1e-6, floor=0.1)
    assert hot == pytest.approx([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3], abs=1e-12)
    # a stagnating client (P = B) gets at most the uniform weight when others improve
    w = aggregation_weights("fgrpo", [0.7, 0.5], [0.5, 0.5])
    assert w[1] <= 0.5 and min(w) >= 0.1 / 2 and sum(w) == pytest.approx(1.0, abs=1e-12)


def test_weighted_delta_by_hand():
    theta = {"a": torch.tensor([1.0, 2.0])}
    deltas = [{"a": torch.tensor([0.5, -1.0])}, {"a": torch.tensor([-0.25, 4.0])}]
    out = apply_deltas(theta, deltas, [0.75, 0.25], 2.0)
    # 1 + 2·(0.75·0.5 + 0.25·-0.25) = 1.625; 2 + 2·(0.75·-1 + 0.25·4) = 2.5
    assert torch.equal(out["a"], torch.tensor([1.625, 2.5]))


def test_server_skips_a_failed_client_and_counts_it():
    cfg = FGRPOConfig(clients=(fgrpo.ClientConfig(),) * 3, aggregation="fedavg")
    state = ServerState({"a": torch.tensor([0.0])}, [None, None, None])
    ok = ClientResult({"a": torch.tensor([3.0])}, 0.5, {})
    m = state.aggregate({0: ok, 1: RuntimeError("boom"), 2: ClientResult({"a": torch.tensor([1.0])}, 0.2, {})}, cfg)
    assert m["federated/client_failures"] == 1 and m["federated/clients_ok"] == 2
    assert state.weights["a"].item() == 2.0  # (3 + 1) / 2: the survivors, renormalised
    assert state.baselines == [0.5, None, 0.2] and state.round == 1
    m = state.aggregate({0: RuntimeError("x"), 1: RuntimeError("y"), 2: RuntimeError("z")}, cfg)
    assert m["federated/client_failures"] == 4 and state.weights["a"].item() == 2.0  # cumulative; all failed: θ stays


# ------------------------------------------------------------------------------------------ load-time errors
@pytest.mark.parametrize("overrides, message", [
    (["trainer.steps=7"], r"trainer.steps=7 is not a multiple of driver.local_steps=5"),
    (["driver.clients=[{task: {opz: '+'}}]"], r"clients.0.task.opz: unknown key for task 'lab'; allowed: ops"),
    (["driver.clients=[{task: {ops: '/'}}]"], r"clients.0.task: ops='/': use a non-empty subset"),
    (["driver.clients=[{reward_scale: 0}]"], r"reward_scale=0.0: allowed > 0"),
    (["driver.aggregation=mean"], r"'mean' is not allowed; allowed: fgrpo, fedavg, reward"),
    (["driver.mu=1.0"], r"mu=1.0: allowed in \[0, 1\)"),
    (["rollout.generator=vllm"], r"^driver: driver 'fgrpo' does not run with vllm"),
    (["rollout.workers=2", "rollout.shards=2"], r"^driver: driver 'fgrpo' does not run with ray"),
    (["driver.round_timeout_s=-1"], r"round_timeout_s=-1(\.0)?: allowed >= 0 \(0: no timeout; null, the default: "
                                    r"from the measured replies\)$"),
])
def test_load_errors_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        load(RECIPE, overrides)
    assert "\n" not in str(e.value)


def test_the_flower_reply_limit_by_default_comes_from_the_measured_replies():
    from groupwise.methods.fgrpo import flower_app

    assert load(RECIPE).driver.cfg.round_timeout_s is None  # unset: derived (was a fixed 3600 s)
    assert flower_app.auto_timeout(None) == 1800.0  # nothing measured yet: the first round, the first eval
    assert flower_app.auto_timeout(10.0) == 120.0  # 5 x 10 s = 50 s, raised to the floor
    assert flower_app.auto_timeout(60.0) == 300.0  # 5 x 60 s


def test_a_run_resumes_with_another_round_timeout(tmp_path):
    """``driver.round_timeout_s`` changes no sample: a run it stopped, or one begun under the old fixed 3600 s
    default, resumes with another; a changed seed is still refused (the check ran)."""
    from groupwise.loop.session import Session, release_lock

    common = [f"out_dir={tmp_path}", "trainer.progress=false"]
    Session(load(RECIPE, [*common, "driver.round_timeout_s=3600"]))
    release_lock(tmp_path / "fgrpo_lab")
    for timeout in ([], ["driver.round_timeout_s=60"]):  # unset (from the measured replies), another number
        Session(load(RECIPE, [*common, *timeout]), resume=True)
        release_lock(tmp_path / "fgrpo_lab")
    with pytest.raises(ConfigError, match=r"--resume with settings that differ from the run's resolved_config.yaml: "
                                          r"seed;"):
        Session(load(RECIPE, [*common, "seed=1"]), resume=True)


def test_the_recipe_loads_with_four_non_iid_clients():
    cfg = load(RECIPE)
    c = cfg.driver.cfg
    assert cfg.driver.name == "fgrpo" and len(c.clients) == 4
    assert [x.reward_scale for x in c.clients] == [1.0, 5.0, 0.2, 1.0]
    k1 = fgrpo.client_config(cfg, c, 1)
    assert k1.task.cfg.ops == "*" and k1.seed == cfg.seed + 1009 and k1.reward.terms[0].weight == 5.0


# ------------------------------------------------------------------------------------------ end to end
def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return load_file(str(last / "model" / "model.safetensors"))


def rows(run_dir: Path) -> list[dict]:
    out = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in out]


def one_client(tmp_path, name, *extra):
    return load(RECIPE, [*TINY, "driver.clients=[{}]", "driver.local_steps=1", "trainer.steps=3",
                         "trainer.save_every=0", "eval.before=false", "eval.after=false", f"out_dir={tmp_path}",
                         f"name={name}", *extra])


def test_one_client_and_one_local_step_equals_centralised_grpo(tmp_path):
    fed = one_client(tmp_path, "fed")
    central = dataclasses.replace(fed, driver=load(None).driver, name="central")
    api.run(fed)
    api.run(central)
    a, b = final_weights(tmp_path / "fed"), final_weights(tmp_path / "central")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    fr, cr = rows(tmp_path / "fed"), rows(tmp_path / "central")
    assert [r["reward/mean"] for r in fr] == [r["reward/mean"] for r in cr]
    assert [r["federated/weight_c0"] for r in fr] == [1.0, 1.0, 1.0]
    assert any(r["update/grad_norm"] > 0 for r in cr), "no step trained: the test would be vacuous"


def two_clients(tmp_path, name, *extra):
    return load(RECIPE, [*TINY, "driver.clients=[{task: {ops: '+'}}, {task: {ops: '*'}, reward_scale: 5}]",
                         "driver.local_steps=1", "driver.score=train", "trainer.steps=4", "trainer.save_every=1",
                         "eval.before=false", f"out_dir={tmp_path}", f"name={name}", *extra])


def test_a_failed_client_is_survived_and_counted(tmp_path, monkeypatch):
    real = fgrpo.Client.train

    def flaky(self, weights, rnd):
        if self.k == 1 and rnd == 1:
            raise RuntimeError("injected")
        return real(self, weights, rnd)

    monkeypatch.setattr(fgrpo.Client, "train", flaky)
    api.run(two_clients(tmp_path, "flaky", "eval.after=false"))
    r = rows(tmp_path / "flaky")
    assert [x["federated/client_failures"] for x in r] == [0, 1, 1, 1]
    assert (r[1]["federated/clients_ok"] == 1 and r[1]["federated/weight_c0"] == 1.0
            and "federated/weight_c1" not in r[1])


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    api.run(two_clients(tmp_path, "ref"))
    real = ServerState.aggregate

    def dies_in_round_3(self, results, cfg):
        if self.round == 2:
            raise SystemExit("killed")
        return real(self, results, cfg)

    monkeypatch.setattr(ServerState, "aggregate", dies_in_round_3)
    cfg = two_clients(tmp_path, "killed")
    with pytest.raises(SystemExit):
        api.run(cfg)
    assert len(rows(tmp_path / "killed")) == 2
    monkeypatch.setattr(ServerState, "aggregate", real)
    result = api.run(cfg, resume=True)
    a, b = rows(tmp_path / "ref"), rows(tmp_path / "killed")
    assert [x["step"] for x in b] == [1, 2, 3, 4, 4]  # four rounds, then the eval after
    assert a == b
    wa, wb = final_weights(tmp_path / "ref"), final_weights(tmp_path / "killed")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert "after" in result and 0 <= result["after"]["eval/worst_mean_at_k"] <= 1
    assert any(x["federated/weight_c0"] != 0.5 for x in a[1:4]), "fgrpo weights never moved: vacuous"


def test_the_flower_backend_without_flwr_is_a_one_line_load_error(monkeypatch):
    real = fgrpo.importlib.util.find_spec
    monkeypatch.setattr(fgrpo.importlib.util, "find_spec", lambda name: None if name == "flwr" else real(name))
    with pytest.raises(ConfigError, match=r"backend=flower needs flwr, which is not installed: pip install "
                                          r"'groupwise\[federated\]'") as e:
        load(RECIPE, ["driver.backend=flower"])
    assert "\n" not in str(e.value)
