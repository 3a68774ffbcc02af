import math

import pytest
import torch
from torch.testing import assert_close

from groupwise.config import load
from groupwise.losses import LOSSES
from groupwise.methods.opsd.loss import OPSDConfig, entry_divergence, opsd
from groupwise.registry import ConfigError
from groupwise.standard.teachers import topk_support
from groupwise.types import LossInputs, TeacherOutput

P, Q = [0.5, 0.5], [0.9, 0.1]  # student, teacher over a two-token vocabulary


def inputs(p_rows, q_rows, sampled=None, k=0):
    """One row per distribution pair, one token each; ``sampled`` = the student's sampled token ids."""
    lp = torch.log(torch.tensor(p_rows, dtype=torch.float64)).unsqueeze(1).requires_grad_(True)  # [B, 1, V]
    lq = torch.log(torch.tensor(q_rows, dtype=torch.float64)).unsqueeze(1)
    ids = torch.tensor(sampled or [0] * len(p_rows)).view(-1, 1, 1)
    teacher = TeacherOutput(lq.gather(-1, ids).squeeze(-1), vocab_logprobs=lq)
    if k:
        teacher.topk_ids, teacher.topk_logprobs, teacher.tail_logprob = topk_support(lq, k)
    mask = torch.ones(len(p_rows), 1, dtype=torch.bool)
    return LossInputs(logprobs=lp.gather(-1, ids).squeeze(-1), old_logprobs=torch.zeros(len(p_rows), 1),
                      advantages=torch.zeros(len(p_rows), 1), completion_mask=mask,
                      rollout_logprobs=torch.zeros(len(p_rows), 1), teacher=teacher, vocab_logprobs=lp), lp


def test_pinned_divergences_at_the_endpoints_and_the_mixture():
    inf = math.inf
    # β = 0: KL(q‖p) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.5290080 − 0.1609438 = 0.3680642
    assert opsd(inputs([P], [Q])[0], OPSDConfig(beta=0.0, token_clip=inf)).per_token.item() == pytest.approx(
        0.3680642, abs=1e-7)
    # β = 1: KL(p‖q) = 0.5 ln(0.5/0.9) + 0.5 ln 5 = −0.2938933 + 0.8047190 = 0.5108256
    assert opsd(inputs([P], [Q])[0], OPSDConfig(beta=1.0, token_clip=inf)).per_token.item() == pytest.approx(
        0.5108256, abs=1e-7)
    # β = 0.5, m = [0.7, 0.3]: ½[0.9 ln(9/7) + 0.1 ln(1/3)] + ½[0.5 ln(5/7) + 0.5 ln(5/3)]
    #   = ½(0.2261830 − 0.1098612) + ½(−0.1682361 + 0.2554128) = 0.0581609 + 0.0435884 = 0.1017493
    assert opsd(inputs([P], [Q])[0], OPSDConfig(beta=0.5, token_clip=inf)).per_token.item() == pytest.approx(
        0.1017493, abs=1e-7)


def test_the_per_entry_clip_applies_before_the_sum_and_can_make_a_token_negative():
    # β = 0, τ = 0.05: entries 0.5290080 → 0.05 and −0.1609438 (kept): r = −0.1109438
    out = opsd(inputs([P], [Q])[0], OPSDConfig(beta=0.0, token_clip=0.05))
    assert out.per_token.item() == pytest.approx(-0.1109438, abs=1e-7)
    assert out.metrics["loss/opsd_clip_frac"] == (0.5, 1.0)
    lp = torch.log(torch.rand(4, 3, 7).softmax(-1).double())
    lq = torch.log(torch.rand(4, 3, 7).softmax(-1).double())
    for beta in (0.0, 0.3, 1.0):
        assert (torch.clamp(entry_divergence(lp, lq, beta), max=0.05) <= 0.05).all()
        assert (entry_divergence(lp, lq, beta).sum(-1) >= -1e-12).all()  # unclipped: a true divergence


def test_topk_support_with_all_but_one_token_equals_the_full_vocabulary():
    torch.manual_seed(0)
    p = torch.rand(3, 6, dtype=torch.float64).softmax(-1).tolist()  # float64: each row sums to 1 to 1e-16
    q = torch.rand(3, 6, dtype=torch.float64).softmax(-1).tolist()
    for beta in (0.0, 0.5, 1.0):
        cfg_v, cfg_k = OPSDConfig(beta=beta, support="vocab"), OPSDConfig(beta=beta, support="topk")
        full = opsd(inputs(p, q)[0], cfg_v).per_token
        topk = opsd(inputs(p, q, k=5)[0], cfg_k).per_token  # 5 kept + the tail bucket = the sixth token
        assert_close(topk, full, rtol=0, atol=1e-9)


def test_gradients_match_a_hand_written_objective():
    inp, lp = inputs([P, [0.2, 0.8]], [Q, [0.6, 0.4]])
    opsd(inp, OPSDConfig(beta=0.5, token_clip=math.inf)).per_token.sum().backward()
    lp2 = lp.detach().clone().requires_grad_(True)
    p, q = lp2.exp(), torch.tensor([Q, [0.6, 0.4]], dtype=torch.float64).unsqueeze(1)
    m = 0.5 * p + 0.5 * q
    (0.5 * (q * (q / m).log()).sum() + 0.5 * (p * (p / m).log()).sum()).backward()
    assert_close(lp.grad, lp2.grad, rtol=0, atol=1e-12)


def test_sampled_form_is_the_reverse_kl_policy_gradient():
    inp, lp = inputs([P, [0.2, 0.8]], [Q, [0.6, 0.4]], sampled=[0, 1])
    out = opsd(inp, OPSDConfig(support="sampled"))
    # −(log q_y − log p_y)·log p_y: row 0 y=0: −(ln .9 − ln .5)·ln .5; row 1 y=1: −(ln .4 − ln .8)·ln .8
    expected = torch.tensor([[-(math.log(0.9) - math.log(0.5)) * math.log(0.5)],
                             [-(math.log(0.4) - math.log(0.8)) * math.log(0.8)]], dtype=torch.float64)
    assert_close(out.per_token, expected, rtol=0, atol=1e-12)
    out.per_token.sum().backward()
    # d/d log p_y = −(log q_y − log p_y): only the sampled entries move
    assert_close(lp.grad.squeeze(1), torch.tensor([[-math.log(1.8), 0.0], [0.0, -math.log(0.5)]],
                                                  dtype=torch.float64), rtol=0, atol=1e-12)


def test_needs_follow_the_support_and_config_errors():
    entry = LOSSES.get("opsd")
    assert entry.needs_of(OPSDConfig()) == ("teacher_vocab", "vocab")
    assert entry.needs_of(OPSDConfig(support="topk")) == ("teacher_topk", "vocab")
    assert entry.needs_of(OPSDConfig(support="sampled")) == ("teacher",)
    with pytest.raises(ValueError, match="beta=1.5"):
        OPSDConfig(beta=1.5)
    with pytest.raises(ConfigError, match=r"loss.terms.0: loss 'opsd' requires 'teacher'.*allowed: add teacher 'ema'"):
        load(None, ["loss.terms=[{name: opsd}]"])
    with pytest.raises(ConfigError, match=r"requires 'teacher_topk'.*top_k"):
        load(None, ["teacher=frozen", "loss.terms=[{name: opsd, support: topk}]"])
    load(None, ["teacher={name: frozen, top_k: 8}", "loss.terms=[{name: opsd, support: topk}]"])


def test_through_the_learner_a_teacher_equal_to_the_student_gives_zero_loss(tiny_model, tokenizer):
    import copy

    from support import learner, rows

    from groupwise.loop.pipeline import CountingTeacher, encode
    from groupwise.registry import BuildEnv
    from groupwise.standard.teachers import TeacherConfig
    from groupwise.teachers import TEACHERS
    from groupwise.types import Problem, Sample

    model = copy.deepcopy(tiny_model)
    env = BuildEnv(run=load(None), policy=model, tokenizer=tokenizer, encode=lambda p: encode(p, tokenizer),
                   initial_policy=lambda: copy.deepcopy(model).eval().requires_grad_(False))
    problem = Problem("p", "1+2", "3")
    c = torch.tensor(tokenizer.encode("<answer>3</answer>", add_special_tokens=False) + [tokenizer.eos_token_id])
    s = Sample(prompt_ids=encode(problem, tokenizer), completion_ids=c, rollout_logprobs=torch.zeros(len(c)),
               loss_mask=torch.ones(len(c), dtype=torch.bool), finish_reason="stop")
    for support, top_k in (("vocab", 0), ("topk", 5), ("sampled", 0)):
        teacher = CountingTeacher(TEACHERS.get("frozen").build(TeacherConfig(top_k=top_k), env))
        over = ["optim.grad_clip=0", f"teacher={{name: frozen, top_k: {top_k}}}",
                f"loss.terms=[{{name: opsd, support: {support}}}]"]
        m = learner(copy.deepcopy(model), tokenizer, over, teacher=teacher).step(
            rows([s], [torch.zeros(s.length)], [problem]))
        assert abs(m["loss/opsd_div"]) < 1e-6 and m["update/grad_norm"] < 1e-5, support
        assert teacher.metrics()["teacher/forwards"] == 1.0
