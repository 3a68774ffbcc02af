"""Sharded data parallelism (``trainer.data_parallel: fsdp``, FSDP2 over gloo on CPU): 2 processes, each holding
half of every weight, gradient and optimizer moment and training on its share of the rows, end with the same
gradients, weights and step metrics as 1 process on the whole batch, also when one rank has more micro-batches
than the other (it then runs zero-loss passes), and the checkpoint state gathered from the shards is the
1-process run's own, in the same layout, so either can resume the other."""

import dataclasses

import pytest
import support
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_update import make_samples

from groupwise.models import fsdp
from groupwise.models.tiny import build_model, build_tokenizer

OVERRIDES = ["optim.grad_clip=1.0", "optim.ppo_epochs=2", "loss.reduction=token_mean"]


def batch(tok, zero_every, common=False):
    samples = make_samples(tok, n=9)
    if common:  # groups of 3 rows behind one prompt, every prompt behind one 6-token "system prompt"
        g = torch.Generator().manual_seed(1)
        head = torch.randint(2, 100, (6,), generator=g)
        prompts = [torch.cat([head, torch.randint(2, 100, (1 + k,), generator=g)]) for k in range(3)]
        samples = [dataclasses.replace(s, prompt_ids=prompts[i // 3]) for i, s in enumerate(samples)]
    adv = [torch.full((s.length,), 0.0 if i % zero_every == 0 else float(i % 3) - 1.0) for i, s in enumerate(samples)]
    return support.rows(samples, adv)


def train_one_step(model, tok, budget, zero_every, common=False):
    learner = support.learner(model, tok, [*OVERRIDES, f"optim.micro_batch_tokens={budget}"])
    grads = {}
    real = learner.optimizer.step

    def capture(*a, **k):  # the gradient the optimizer sees (after the reduction and the clip)
        grads.update({n: fsdp.full(p.grad).clone() for n, p in model.named_parameters()})
        return real(*a, **k)

    learner.optimizer.step = capture
    metrics = learner.step(batch(tok, zero_every, common))
    weights = {n: fsdp.full(p.detach()).clone() for n, p in model.named_parameters()}
    return weights, grads, metrics, learner


def worker(rank, world, init, out, budget, zero_every, common):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = fsdp.shard(build_model("lab-tiny", tok, seed=0))
    weights, grads, metrics, learner = train_one_step(model, tok, budget, zero_every, common)
    shard = {n: fsdp.local(p.detach()).numel() for n, p in model.named_parameters()}
    saved_weights, saved_optim = learner.full_state()
    torch.save({"weights": weights, "grads": grads, "metrics": metrics, "shard": shard, "saved": saved_weights,
                "optim": saved_optim}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("budget,zero_every,common", [(40, 3, False), (12, 9, False), (40, 3, True)],
                         ids=["even", "uneven-micro-batches", "shared-prompts-with-a-common-prefix"])
def test_two_sharded_processes_equal_one(tmp_path, budget, zero_every, common):
    """The third case runs ``optim.shared_prefix`` (the default) on prompts that share a system prompt: one rank's
    micro-batch holds two distinct prompts (whose common prefix an unsharded pass runs once more), the other's one
    prompt, so the ranks' passes must not depend on that (``update.Learner._forward``)."""
    tok = build_tokenizer()
    one_w, one_g, one_m, one_learner = train_one_step(build_model("lab-tiny", tok, seed=0), tok, budget, zero_every,
                                                      common)
    mp.spawn(worker, args=(2, f"file://{tmp_path}/rendezvous", str(tmp_path), budget, zero_every, common), nprocs=2,
             join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in ranks:
        for k in one_w:
            torch.testing.assert_close(r["grads"][k], one_g[k], rtol=1e-4, atol=1e-7)
            torch.testing.assert_close(r["weights"][k], one_w[k], rtol=1e-4, atol=1e-5)  # as test_data_parallel
        for k in ("loss/total", "policy/entropy", "update/loss_tokens", "update/skipped_rows", "update/grad_norm"):
            assert r["metrics"][k] == pytest.approx(one_m[k], rel=1e-4, abs=1e-7), k
    big = max(one_w, key=lambda k: one_w[k].numel())
    assert ranks[0]["shard"][big] * 2 == one_w[big].numel(), "each rank holds half of the largest weight"
    counts = [r["metrics"]["update/micro_batches"] for r in ranks]
    assert counts[0] == counts[1] == one_m["update/micro_batches"] >= 2  # the real passes, summed over ranks
    # the gathered checkpoint state: the 1-process run's weights and optimizer state, in its layout
    saved, optim = ranks[0]["saved"], ranks[0]["optim"]
    assert ranks[1]["saved"] == {} and ranks[1]["optim"] == {}, "only rank 0 gets the whole state"
    for k in one_w:
        torch.testing.assert_close(saved[k], one_w[k], rtol=1e-4, atol=1e-5)
    ref = one_learner.optimizer.state_dict()
    assert optim["param_groups"][0]["params"] == ref["param_groups"][0]["params"]
    for i, st in ref["state"].items():
        torch.testing.assert_close(optim["state"][i]["exp_avg"], st["exp_avg"], rtol=1e-3, atol=1e-7)
        assert float(optim["state"][i]["step"]) == float(st["step"]) == 2.0
    start = build_model("lab-tiny", tok, seed=0).state_dict()
    assert max(float((one_w[k] - start[k]).abs().max()) for k in one_w) > 1e-4, "the step changed nothing"


def test_uneven_batches_do_make_one_rank_idle():
    """The second case above is the one the zero-loss passes exist for: one rank has more micro-batches."""
    from groupwise.update import plan_micro_batches, shard_rows

    tok = build_tokenizer()
    b = batch(tok, 9)
    active = [i for i in range(len(b.samples)) if b.advantages[i].ne(0).any()]
    plans = [plan_micro_batches([b.samples[i] for i in shard_rows(active, b.samples, r, 2)], 12) for r in (0, 1)]
    assert len(plans[0]) != len(plans[1])


@pytest.mark.parametrize("override,key", [("model.lora={r: 4}", "model.lora"),
                                          ("rollout.workers=1", "rollout.workers")])
def test_what_fsdp_does_not_support_is_a_one_line_load_error(override, key):
    from groupwise.config import load
    from groupwise.registry import ConfigError

    if key == "rollout.workers":
        pytest.importorskip("ray")
    with pytest.raises(ConfigError, match=rf"^trainer.data_parallel=fsdp: {key} under FSDP is not built; use "
                                          r"trainer.data_parallel=replicate with it$"):
        load(None, ["trainer.data_parallel=fsdp", override])
    with pytest.raises(ConfigError, match=r"trainer.data_parallel: .*'sharded'.*replicate.*fsdp"):
        load(None, ["trainer.data_parallel=sharded"])
