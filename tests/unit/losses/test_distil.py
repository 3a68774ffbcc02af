import dataclasses
import math

import pytest
import torch
from support import rows
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.distil import (
    DistILConfig,
    DistILCostConfig,
    DistILLossConfig,
    baselines,
    cost_to_go,
    distil,
    distil_credit,
    local_ce,
    teacher_entropy,
)
from groupwise.registry import ConfigError
from groupwise.rollout import TRANSFORMS
from groupwise.standard.teachers import topk_support
from groupwise.types import Group, LossInputs, Problem, Sample, TeacherOutput


def inputs(logits, q_rows, k=0):
    lp = torch.log_softmax(logits, -1)  # [B, 1, V]
    lq = torch.log(torch.tensor(q_rows, dtype=torch.float64)).unsqueeze(1)
    teacher = TeacherOutput(lq[..., 0], vocab_logprobs=lq)
    if k:
        teacher.topk_ids, teacher.topk_logprobs, teacher.tail_logprob = topk_support(lq, k)
    b = len(q_rows)
    return LossInputs(logprobs=lp[..., 0], old_logprobs=torch.zeros(b, 1), advantages=torch.zeros(b, 1),
                      completion_mask=torch.ones(b, 1, dtype=torch.bool), rollout_logprobs=torch.zeros(b, 1),
                      teacher=teacher, vocab_logprobs=lp)


def test_pinned_cross_entropy_its_bound_and_its_logit_gradient():
    # p = [0.8, 0.2], q = [0.9, 0.1]: ℓ = −(0.9 ln 0.8 + 0.1 ln 0.2) = 0.2008292 + 0.1609438 = 0.3617730
    z = torch.log(torch.tensor([[[0.8, 0.2]]], dtype=torch.float64)).requires_grad_(True)
    out = distil(inputs(z, [[0.9, 0.1]]), DistILLossConfig())
    assert out.per_token.item() == pytest.approx(0.3617730, abs=1e-7)
    # KL = ℓ − H(q) = 0.3617730 − 0.3250830 = 0.0366900
    assert out.metrics["loss/distil_kl"][0] == pytest.approx(0.0366900, abs=1e-7)
    out.per_token.sum().backward()
    assert_close(z.grad, torch.tensor([[[0.8 - 0.9, 0.2 - 0.1]]], dtype=torch.float64))  # softmax(z) − π_T
    torch.manual_seed(0)
    lp, lq = torch.randn(50, 6).log_softmax(-1), torch.randn(50, 6).log_softmax(-1)
    assert (local_ce(lp, lq) >= teacher_entropy(lq) - 1e-6).all()
    assert_close(local_ce(lq, lq), teacher_entropy(lq))  # equality iff the student is the teacher


def test_topk_support_with_all_but_one_token_equals_the_vocabulary():
    torch.manual_seed(1)
    z = torch.randn(3, 1, 5, dtype=torch.float64)
    q = torch.rand(3, 5, dtype=torch.float64).softmax(-1).tolist()
    full = distil(inputs(z, q), DistILLossConfig(support="vocab")).per_token
    topk = distil(inputs(z, q, k=4), DistILLossConfig(support="topk")).per_token
    assert_close(full, topk)


def test_pinned_cost_to_go_and_both_baselines():
    assert cost_to_go(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [9.0, 7.0, 4.0, 0.0]
    assert cost_to_go(torch.tensor([1.0, 2.0, 3.0, 4.0]), horizon=1).tolist() == [2.0, 3.0, 4.0, 0.0]
    costs = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 0.0, 6.0])]
    # C = [5, 3, 0] and [6, 6, 0]: with two rows the leave-one-out baseline is the sibling's C
    assert [b.tolist() for b in baselines(costs, "position")] == [[6.0, 6.0, 0.0], [5.0, 3.0, 0.0]]
    # total: sibling's total (6, resp. 6) × remaining fraction (2/3, 1/3, 0)
    assert [b.tolist() for b in baselines(costs, "total")] == [[4.0, 2.0, 0.0], [4.0, 2.0, 0.0]]
    # different lengths: row 0 (L=2) reads the sibling (L=4) at ⌊(t + ½)/2·4⌋ = 1, 3
    b = baselines([torch.tensor([1.0, 1.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])], "position")
    assert b[0].tolist() == [7.0, 0.0]
    assert baselines([torch.tensor([1.0, 2.0])], "position")[0].tolist() == [0.0, 0.0]  # a group of one: b = 0


def sample(cost, n=None):
    n = n or len(cost)
    return Sample(prompt_ids=torch.tensor([1]), completion_ids=torch.arange(2, 2 + n), rollout_logprobs=torch.zeros(n),
                  loss_mask=torch.ones(n, dtype=torch.bool), finish_reason="stop",
                  meta={"distil_cost": torch.tensor(cost)})


def group_batch(costs, adv):
    b = rows([sample(c) for c in costs], [torch.tensor(a) for a in adv])
    return dataclasses.replace(b, group_index=torch.zeros(len(costs), dtype=torch.long))


def test_credit_writes_the_baselined_sequence_term_and_keeps_grpo_at_neutral_settings():
    batch = group_batch([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]], [0.5, -0.5])
    out = distil_credit(batch, DistILConfig(c_seq=1.0, beta_rl=0.0))
    assert_close(out.advantages, torch.tensor([[1.0, 3.0, 0.0], [-1.0, -3.0, 0.0]]))  # −(C − b)
    hybrid = distil_credit(batch, DistILConfig(c_seq=0.5, beta_rl=2.0))
    assert_close(hybrid.advantages, torch.tensor([[1.5, 2.5, 1.0], [-1.5, -2.5, -1.0]]))
    same = distil_credit(batch, DistILConfig(c_seq=0.0, beta_rl=1.0))
    assert torch.equal(same.advantages, batch.advantages)  # GRPO bit for bit
    flat = distil_credit(group_batch([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], [0.0] * 3), DistILConfig())
    assert torch.equal(flat.advantages, torch.zeros(3, 2))  # equal cost-to-go: the sequence term vanishes


def tabular(theta1, theta2, q1, q2, c_seq):
    """A 2-step MDP: action a1 ∈ {A, B}, then a2 with logits theta2[a1]; the teacher is q1 at step 1 and q2[a1]."""
    lp1 = theta1.log_softmax(-1)
    exact = local_ce(lp1, q1.log()) + sum(lp1[a].exp() * local_ce(theta2[a].log_softmax(-1), q2[a].log())
                                          for a in (0, 1))
    surrogate = 0.0
    for a1 in (0, 1):
        for a2 in (0, 1):
            lp2 = theta2[a1].log_softmax(-1)
            costs = torch.stack([local_ce(lp1, q1.log()), local_ce(lp2, q2[a1].log())])
            c = cost_to_go(costs.detach())
            w = (lp1[a1] + lp2[a2]).exp().detach()  # the probability of the trajectory (expectation by enumeration)
            surrogate = surrogate + w * (costs.sum() + c_seq * (lp1[a1] * c[0] + lp2[a2] * c[1]))
    return exact, surrogate


def test_the_surrogate_gradient_is_the_exact_gradient_and_credit_needs_the_sequence_term():
    torch.manual_seed(0)
    theta1, theta2 = torch.randn(2, dtype=torch.float64, requires_grad=True), torch.randn(2, 2, dtype=torch.float64,
                                                                                           requires_grad=True)
    q1, q2 = torch.tensor([0.3, 0.7], dtype=torch.float64), torch.tensor([[0.6, 0.4], [0.1, 0.9]], dtype=torch.float64)
    exact, surrogate = tabular(theta1, theta2, q1, q2, c_seq=1.0)
    g_exact = torch.autograd.grad(exact, (theta1, theta2), retain_graph=True)
    g_sur = torch.autograd.grad(surrogate, (theta1, theta2))
    for a, b in zip(g_exact, g_sur):
        assert_close(a, b, rtol=1e-12, atol=1e-12)
    # teacher indifferent at step 1 (q1 = π_1); after B (index 1) it disagrees strongly with the student at step 2
    theta1 = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    theta2 = torch.tensor([[0.0, 0.0], [2.0, -2.0]], dtype=torch.float64, requires_grad=True)
    q1, q2 = (torch.tensor([0.5, 0.5], dtype=torch.float64),
              torch.tensor([[0.5, 0.5], [0.01, 0.99]], dtype=torch.float64))
    for c_seq, favours_a in ((1.0, True), (0.0, False)):
        g = torch.autograd.grad(tabular(theta1, theta2, q1, q2, c_seq)[1], theta1)[0]
        if favours_a:
            assert g[0] < 0 < g[1]  # descending the loss raises the logit of A
        else:
            assert_close(g, torch.zeros(2, dtype=torch.float64))


class StubTeacher:
    def __init__(self, q):
        self.q = q

    def score(self, samples, problems, want):
        assert want.vocab
        return TeacherOutput(torch.zeros(len(samples), 2), vocab_logprobs=self.q.log().expand(len(samples), 2, 2))


def test_the_transform_stores_each_rollouts_pinned_costs(monkeypatch):
    p = torch.tensor([[0.8, 0.2], [0.5, 0.5]], dtype=torch.float64)  # the student at the two positions
    q = torch.tensor([[0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)

    class Ctx:
        teacher = StubTeacher(q)

        @staticmethod
        def policy_logprobs(samples, vocab=False):
            assert vocab
            return [p.log() for _ in samples]

    g = Group(Problem("p", "q", "7"), [sample([0.0, 0.0]), sample([0.0, 0.0])])
    for cost, want in (("ce", [0.3617730, math.log(2)]), ("kl", [0.0366900, 0.0])):
        TRANSFORMS.get("distil").build(DistILCostConfig(cost=cost, chunk=1))([g], Ctx)
        for s in g.samples:
            assert s.meta["distil_cost"].tolist() == pytest.approx(want, abs=1e-7)


def test_the_transform_without_a_built_teacher_is_a_clear_error():
    class Ctx:
        teacher = None

    with pytest.raises(ValueError, match="needs the run's teacher"):
        TRANSFORMS.get("distil").build(DistILCostConfig())([Group(Problem("p", "q", "7"), [sample([0.0])])], Ctx)


def test_invalid_settings_are_load_time_errors():
    with pytest.raises(ConfigError, match="c_seq"):
        load(None, ["credit=[{name: distil, c_seq: -1}]"])
    with pytest.raises(ConfigError,
                       match=r"credit 'distil' requires 'distil_costs'.*allowed: add group transform 'distil'"):
        load(None, ["credit=[distil]", "loss.terms=[ppo_clip, distil]", "teacher=frozen"])
    with pytest.raises(ConfigError,
                       match=r"credit 'distil' requires 'policy_gradient'.*allowed: add .*loss 'paft'.*"
                             r"loss 'ppo_clip'"):
        load(None, ["credit=[distil]", "rollout.transforms=[distil]", "loss.terms=[distil]", "teacher=frozen"])
    with pytest.raises(ConfigError, match=r"rollout.transforms.0: group transform 'distil' requires 'teacher'"):
        load(None, ["rollout.transforms=[distil]"])
    cfg = load("recipes/distil_lab.yaml")
    assert [t.name for t in cfg.loss.terms] == ["ppo_clip", "distil"]
