"""A pretrained model's format warm-up (``model.warm_start: true``): SFT of a LoRA adapter on the task's reference
traces, merged into the weights and cached; the default ``auto`` leaves a pretrained model as it is."""

import json

import pytest
import torch

from groupwise.config import load
from groupwise.models import lora, warm_start
from groupwise.models.forward import completion_logprobs, pack
from groupwise.models.load import load_model, load_pretrained
from groupwise.registry import BuildEnv, ConfigError
from groupwise.tasks.base import render_prompt

pytest.importorskip("peft")


@pytest.fixture
def base_dir(tiny_qwen, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    return tiny_qwen(max_positions=256)


def setup(base_dir, *overrides):
    cfg = load(None, [f"model.path={base_dir}", "model.lora={r: 4}", "model.warm_start_steps=30",
                      "model.warm_start_batch=8", "model.warm_start_lr=1e-2", *overrides])
    return cfg, cfg.task.build(BuildEnv(run=cfg, seed=0))


def sft_loss(model, tok, task) -> float:
    """Token-mean NLL of 16 fixed reference traces (the warm start's own loss)."""
    import random

    examples = task.sft_examples(random.Random(123), 16)
    packed = pack([torch.tensor(tok.encode(render_prompt(p, tok), add_special_tokens=False)) for p, _ in examples],
                  [torch.tensor(tok.encode(t, add_special_tokens=False) + [tok.eos_token_id]) for _, t in examples],
                  tok.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(model, packed).logprobs
    return float(-(lp * packed.completion_mask).sum() / packed.completion_mask.sum())


def test_auto_leaves_a_pretrained_model_as_it_is(base_dir):
    cfg, task = setup(base_dir)
    assert cfg.model.warm_start == "auto"
    policy, tok = load_model(cfg.model, task)
    base, _ = load_pretrained(base_dir)
    assert not (base_dir.parent / "cache" / "warm_start").exists()
    assert sft_loss(policy, tok, task) == sft_loss(base, tok, task)


def test_true_trains_the_adapter_on_the_traces_merges_it_and_caches_it(base_dir, monkeypatch):
    cfg, task = setup(base_dir, "model.warm_start=true")
    calls = []
    monkeypatch.setattr(warm_start, "advance", calls.append)  # SFT steps done (the screen's counter)
    policy, tok = load_model(cfg.model, task)
    assert len(calls) == 30 and lora.is_lora(policy)
    (warm,) = (base_dir.parent / "cache" / "warm_start").glob("base-*")
    meta = json.loads((warm / "warm_start.json").read_text())
    assert meta["source"] == str(base_dir) and meta["lora"]["r"] == 4 and meta["steps"] == 30
    base, _ = load_pretrained(base_dir)
    merged, _ = load_pretrained(warm)
    # the RL run's fresh adapter starts at the warmed-up weights (B = 0) ...
    assert sft_loss(policy, tok, task) == pytest.approx(sft_loss(merged, tok, task), abs=1e-6)
    # ... which fit the traces better than the base (measured: 4.66 -> 4.43 nats/token; a rank-4 adapter on a
    # random 2-layer model learns slowly)
    assert sft_loss(merged, tok, task) < sft_loss(base, tok, task) - 0.1
    # only the adapter trained: the layers LoRA does not wrap (embeddings, norms, head) are the base's bytes
    b, m = base.state_dict(), merged.state_dict()
    assert b.keys() == m.keys()
    for k in b:
        linear = k.endswith("proj.weight")
        assert torch.equal(b[k], m[k]) != linear, k
    # a second load reuses the cache; another adapter shape is another warm start
    load_model(cfg.model, task)
    assert len(calls) == 30
    cfg8, _ = setup(base_dir, "model.warm_start=true", "model.lora={r: 8}")
    load_model(cfg8.model, task)
    assert len(calls) == 60 and len(list((base_dir.parent / "cache" / "warm_start").glob("base-*"))) == 2


def test_a_warm_start_of_an_adapter_is_refused(base_dir, tmp_path):
    cfg, task = setup(base_dir)
    policy, tok = load_model(cfg.model, task)
    policy.save_pretrained(tmp_path / "adapter")
    tok.save_pretrained(tmp_path / "adapter")
    cfg, _ = setup(tmp_path / "adapter", "model.warm_start=true")
    with pytest.raises(ConfigError, match=r"model.warm_start: true with model.path '.*adapter', a LoRA adapter.*"
                                          r"allowed: model.warm_start: auto or false"):
        load_model(cfg.model, task)


def test_micro_batches_give_the_one_pass_update(base_dir, monkeypatch):
    """A pretrained model's SFT batch runs in MICRO_ROWS-row passes, normalised by the whole batch's tokens: the
    same warm start as one pass of the batch (float summation order aside)."""
    from groupwise.models import sources, warm_start

    cfg, task = setup(base_dir, "model.warm_start=true", "model.warm_start_steps=3")
    src = sources.resolve(str(base_dir))
    weights = {}
    for rows in (3, 8):  # 8 = the whole batch in one pass; 3 leaves a short last pass (3 + 3 + 2)
        monkeypatch.setattr(warm_start, "MICRO_ROWS", rows)
        model, _ = warm_start.sft(str(base_dir), task, cfg.model, source=src)
        weights[rows] = model.state_dict()
    assert any(not torch.equal(weights[3][k], load_pretrained(base_dir)[0].state_dict()[k]) for k in weights[3])
    for k in weights[8]:
        torch.testing.assert_close(weights[3][k], weights[8][k], atol=1e-6, rtol=1e-5)


def test_a_killed_build_leaves_nothing_behind_and_files_follow_the_umask(base_dir):
    """A build killed mid-way (SIGKILL: no ``finally``) left its temporary folder in the cache; the next build of
    that entry, holding its lock, removes it. The saved files get the umask's mode, not safetensors' 0600."""
    import os

    from groupwise.models import sources
    from groupwise.models.warm_start import warm_start_key

    cfg, task = setup(base_dir, "model.warm_start=true", "model.warm_start_steps=1")
    root = base_dir.parent / "cache" / "warm_start"
    name = f"base-{warm_start_key(str(base_dir), task, cfg.model, sources.resolve(str(base_dir)))}"
    (root / f".tmp-{name}-99999").mkdir(parents=True)
    (root / f".tmp-{name}-99999" / "model.safetensors").write_bytes(b"half")
    old = os.umask(0o027)
    try:
        load_model(cfg.model, task)
    finally:
        os.umask(old)
    assert sorted(x.name for x in root.iterdir() if not x.name.endswith(".lock")) == [name]
    assert (root / name / "model.safetensors").stat().st_mode & 0o777 == 0o640


def test_fgrpo_clients_share_the_base_tasks_warm_start(base_dir, monkeypatch):
    """Under FGRPO every client starts from the base task's warm start, one warm-up for the run: a client's own task
    (its overrides) would key a warm-up of its own."""
    from pathlib import Path

    from groupwise.methods.fgrpo import federated as fgrpo

    recipe = str(Path(__file__).parents[3] / "recipes" / "fgrpo_lab.yaml")
    over = [f"model.path={base_dir}", "model.lora={r: 4}", "model.warm_start_steps=3", "model.warm_start_batch=4"]
    assert fgrpo.initial_model_path(load(recipe, over), None) is None  # auto: a pretrained model as it is
    cfg = load(recipe, [*over, "model.warm_start=true"])
    task = cfg.task.build(BuildEnv(run=cfg, seed=0))
    calls = []
    monkeypatch.setattr(warm_start, "advance", calls.append)
    path = fgrpo.initial_model_path(cfg, task)
    (warm,) = (base_dir.parent / "cache" / "warm_start").glob("base-*")
    assert Path(path) == warm and len(calls) == 3
    assert fgrpo.initial_model_path(cfg, task) == path and len(calls) == 3  # the cache: no second warm-up
    for k in range(len(cfg.driver.cfg.clients)):
        m = fgrpo.client_config(cfg, cfg.driver.cfg, k, path).model
        assert m.path == path and m.warm_start is False and m.lora == cfg.model.lora
