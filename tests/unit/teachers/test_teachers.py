import copy
import math

import pytest
import torch
from support import learner, rows
from torch.testing import assert_close

from groupwise.config import load
from groupwise.loop.pipeline import CountingTeacher, encode
from groupwise.losses import student_on_support
from groupwise.models.forward import completion_logprobs, pack
from groupwise.models.load import save_model
from groupwise.registry import BuildEnv, ConfigError
from groupwise.standard.teachers import EMAConfig, ModelTeacherConfig, PrivilegedConfig, TeacherConfig, topk_support
from groupwise.teachers import TEACHERS, TeacherWant, privileged_problem
from groupwise.types import Problem, Sample


def env_for(model, tokenizer, overrides=(), task=None):
    cfg = load(None, ["model.warm_start=false", *overrides])
    return BuildEnv(run=cfg, seed=0, task=task, policy=model, tokenizer=tokenizer,
                    initial_policy=lambda: copy.deepcopy(model).eval().requires_grad_(False),
                    encode=lambda p: encode(p, tokenizer))


def make(tokenizer, prompt: str, completion: str, reference: str = "") -> tuple[Sample, Problem]:
    problem = Problem(id=prompt, prompt=prompt, answer="0", reference=reference)
    p = encode(problem, tokenizer)
    c = torch.tensor(tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id])
    return Sample(prompt_ids=p, completion_ids=c, rollout_logprobs=torch.zeros(len(c)),
                  loss_mask=torch.ones(len(c), dtype=torch.bool), finish_reason="stop"), problem


def alone(model, tokenizer, prompt_ids, completion_ids, temperature=1.0):
    """The reference: one row, no padding at all."""
    packed = pack([prompt_ids], [completion_ids], tokenizer.pad_token_id)
    with torch.no_grad():
        return completion_logprobs(model, packed, temperature, with_vocab=True)


def test_privileged_context_alignment_when_context_lengths_differ(tiny_model, tokenizer):
    # a short prompt with a long reference and a long prompt with a short one: under left padding the
    # teacher contexts have the opposite length order to the student's; every row must equal its own
    # unpadded forward (and the batch order must not matter)
    pairs = [make(tokenizer, "1+2", "<answer>3</answer>", reference="<think>1+2=3;so 3.</think><answer>3</answer>"),
             make(tokenizer, "4+5-1+2+3", "<think>so 3.</think><answer>3</answer>", reference="3")]
    samples, problems = [p[0] for p in pairs], [p[1] for p in pairs]
    assert samples[0].prompt_ids.numel() < samples[1].prompt_ids.numel()
    cfg = PrivilegedConfig(context="{prompt}\n<ref>{reference}</ref>", top_k=3)
    teacher = TEACHERS.get("privileged").build(cfg, env_for(tiny_model, tokenizer))
    out = teacher.score(samples, problems, TeacherWant(topk=True, vocab=True))
    ctx = [encode(privileged_problem(p, cfg.context), tokenizer) for p in problems]
    assert ctx[0].numel() > ctx[1].numel()  # the teacher's order is reversed
    for i, s in enumerate(samples):
        ref = alone(tiny_model, tokenizer, ctx[i], s.completion_ids)
        n = s.length
        assert_close(out.logprobs[i, :n], ref.logprobs[0], rtol=0, atol=1e-5)
        assert_close(out.vocab_logprobs[i, :n], ref.vocab_logprobs[0], rtol=0, atol=1e-5)
        assert (out.logprobs[i, n:] == 0).all() and (out.vocab_logprobs[i, n:] == 0).all()
        ids, values, _ = topk_support(ref.vocab_logprobs, 3)
        assert torch.equal(out.topk_ids[i, :n], ids[0]) and assert_close(out.topk_logprobs[i, :n], values[0],
                                                                          rtol=0, atol=1e-5) is None
    swapped = teacher.score(samples[::-1], problems[::-1], TeacherWant())
    assert_close(swapped.logprobs[1, :samples[0].length], out.logprobs[0, :samples[0].length], rtol=0, atol=1e-5)
    # and the student's own context differs: the privileged context really was used
    own = alone(tiny_model, tokenizer, samples[0].prompt_ids, samples[0].completion_ids)
    assert not torch.allclose(own.logprobs[0], out.logprobs[0, :samples[0].length], atol=1e-4)


def test_teacher_logprobs_follow_the_student_temperature(tiny_model, tokenizer):
    s, p = make(tokenizer, "1+2", "<answer>3</answer>")
    env = env_for(tiny_model, tokenizer, ["rollout.temperature=0.7"])
    out = TEACHERS.get("frozen").build(TeacherConfig(), env).score([s], [p], TeacherWant())
    packed = pack([s.prompt_ids], [s.completion_ids], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = tiny_model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                            position_ids=packed.position_ids).logits[0, -s.length - 1:-1].float() / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, s.completion_ids[:, None]).squeeze(-1)  # full vocab, no top-p
    assert_close(out.logprobs[0], expected, rtol=0, atol=1e-5)


def test_frozen_keeps_the_initial_weights_and_privileged_follows_the_policy(tiny_model, tokenizer):
    s, p = make(tokenizer, "1+2", "<answer>3</answer>", reference="3")
    env = env_for(tiny_model, tokenizer)
    frozen = TEACHERS.get("frozen").build(TeacherConfig(), env)
    live = TEACHERS.get("privileged").build(PrivilegedConfig(context="{prompt}"), env)
    before_f, before_l = (t.score([s], [p], TeacherWant()).logprobs.clone() for t in (frozen, live))
    assert_close(before_f, before_l, rtol=0, atol=1e-6)  # "{prompt}" is the student's own context
    with torch.no_grad():
        for q in tiny_model.parameters():
            q.add_(0.05 * torch.randn_like(q))
    assert_close(frozen.score([s], [p], TeacherWant()).logprobs, before_f, rtol=0, atol=0)
    tiny_model.train()
    assert not torch.allclose(live.score([s], [p], TeacherWant()).logprobs, before_l, atol=1e-4)
    assert tiny_model.training  # the pass ran in eval mode and gave the policy back in train mode


def test_ema_decay_pinned_and_state_round_trip(tiny_model, tokenizer):
    env = env_for(tiny_model, tokenizer)
    teacher = TEACHERS.get("ema").build(EMAConfig(decay=0.75), env)
    assert TEACHERS.get("ema").stateful
    w0 = next(teacher.weights.parameters()).detach().clone()
    with torch.no_grad():
        next(tiny_model.parameters()).add_(1.0)  # θ ← θ0 + 1
    teacher.on_step(0, tiny_model)
    # θ_T = 0.75·θ0 + 0.25·(θ0 + 1) = θ0 + 0.25
    assert_close(next(teacher.weights.parameters()), w0 + 0.25, rtol=0, atol=1e-6)
    other = TEACHERS.get("ema").build(EMAConfig(decay=0.75), env_for(copy.deepcopy(tiny_model), tokenizer))
    other.load_state_dict(teacher.state_dict())
    assert torch.equal(next(other.weights.parameters()), next(teacher.weights.parameters()))
    zero = TEACHERS.get("ema").build(EMAConfig(decay=0.0), env)
    zero.on_step(0, tiny_model)
    assert all(torch.equal(a, b) for a, b in zip(zero.weights.parameters(), tiny_model.parameters()))


def test_model_teacher_loads_a_directory_and_checks_the_vocabulary(tiny_model, tokenizer, tmp_path):
    save_model(tiny_model, tokenizer, tmp_path / "teacher")
    s, p = make(tokenizer, "1+2", "<answer>3</answer>")
    env = env_for(copy.deepcopy(tiny_model), tokenizer)
    teacher = TEACHERS.get("model").build(ModelTeacherConfig(path=str(tmp_path / "teacher")), env)
    ref = alone(tiny_model, tokenizer, s.prompt_ids, s.completion_ids)
    assert_close(teacher.score([s], [p], TeacherWant()).logprobs[0], ref.logprobs[0], rtol=0, atol=1e-5)
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="vocabulary differs"):
        TEACHERS.get("model").build(ModelTeacherConfig(path=str(tmp_path / "teacher")),
                                    env_for(tiny_model, other))


def test_topk_support_and_tail_pinned():
    # p = [0.5, 0.3, 0.2]: top-2 = ids 0, 1 with log 0.5, log 0.3; tail = log 0.2
    lp = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]]))
    ids, values, tail = topk_support(lp, 2)
    assert ids.tolist() == [[[0, 1]]]
    assert_close(values, torch.log(torch.tensor([[[0.5, 0.3]]])), rtol=0, atol=1e-6)
    assert_close(tail, torch.log(torch.tensor([[0.2]])), rtol=0, atol=1e-6)
    # the student on the teacher's support: q = [0.1, 0.6, 0.3] → log 0.1, log 0.6 and tail log 0.3
    q = torch.log(torch.tensor([[[0.1, 0.6, 0.3]]]))
    on, q_tail = student_on_support(q, ids)
    assert_close(on, torch.log(torch.tensor([[[0.1, 0.6]]])), rtol=0, atol=1e-6)
    assert_close(q_tail, torch.log(torch.tensor([[0.3]])), rtol=0, atol=1e-6)
    _, _, none_left = topk_support(lp, 3)  # all mass kept: the tail is floored, not -inf
    assert math.isfinite(float(none_left)) and float(none_left) <= math.log(1e-6)


def test_teacher_kl_through_the_learner_counts_passes_and_matches_the_objective(tiny_model, tokenizer):
    pairs = [make(tokenizer, "1+2", "<answer>3</answer>", reference="3"),
             make(tokenizer, "4+5-1", "<think>so 8.</think><answer>8</answer>", reference="8")]
    samples, problems = [p[0] for p in pairs], [p[1] for p in pairs]
    teacher_model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for q in teacher_model.parameters():
            q.add_(0.05 * torch.randn_like(q))
    model = copy.deepcopy(tiny_model)
    teacher = CountingTeacher(TEACHERS.get("frozen").build(TeacherConfig(), env_for(model, tokenizer)))
    teacher.inner.model = lambda: teacher_model
    over = ["optim.grad_clip=0", "teacher=frozen", "loss.terms=[{name: teacher_kl, weight: 1.0, estimator: k1}]"]
    update = learner(model, tokenizer, over, teacher=teacher)
    grads = {}
    real = update.optimizer.step
    update.optimizer.step = lambda *a, **k: grads.update({n: p.grad.clone() for n, p in model.named_parameters()}) \
        or real(*a, **k)
    m = update.step(rows(samples, [torch.zeros(s.length) for s in samples], problems))
    assert teacher.metrics()["teacher/forwards"] == m["update/micro_batches"] == 1.0
    assert m["update/skipped_rows"] == 0  # teacher_kl is not advantage-only: zero advantages still train
    # k1 per token: −(log π_T − log π_θ); token_mean over the step's 2 rows
    fresh = copy.deepcopy(tiny_model)
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
    lp = completion_logprobs(fresh, packed).logprobs
    with torch.no_grad():
        lt = completion_logprobs(teacher_model, packed).logprobs
    mask = packed.completion_mask
    (-((lt - lp) * mask).sum() / mask.sum()).backward()
    for n, q in fresh.named_parameters():
        assert_close(grads[n], q.grad, rtol=1e-4, atol=1e-7)


def test_teacher_outputs_are_reused_across_ppo_epochs(tiny_model, tokenizer):
    s, p = make(tokenizer, "1+2", "<answer>3</answer>")
    teacher = CountingTeacher(TEACHERS.get("frozen").build(TeacherConfig(), env_for(tiny_model, tokenizer)))
    over = ["teacher=frozen", "optim.ppo_epochs=3", "loss.terms=[{name: teacher_kl}]"]
    learner(copy.deepcopy(tiny_model), tokenizer, over, teacher=teacher).step(rows([s], [torch.zeros(s.length)], [p]))
    assert teacher.metrics()["teacher/forwards"] == 1.0  # computed once, at the step's start weights
    # a zero-weight teacher term costs no teacher pass at all
    zero = ["teacher=frozen", "loss.terms=[{name: ppo_clip}, {name: teacher_kl, weight: 0}]"]
    learner(copy.deepcopy(tiny_model), tokenizer, zero, teacher=teacher).step(rows([s], [torch.ones(s.length)], [p]))
    assert teacher.metrics()["teacher/forwards"] == 0.0


def test_teacher_none_builds_no_teacher_and_provides_nothing():
    entry = TEACHERS.get("none")
    assert entry.build(entry.config(), None) is None and entry.abilities("provides", entry.config()) == ()
    assert TEACHERS.optional  # a teacher slot may build to None


def test_config_errors_name_what_is_wrong():
    with pytest.raises(ConfigError, match=r"loss.terms.1: loss 'teacher_kl' requires 'teacher', which no selected "
                                          r"component provides; allowed: add teacher ") as refused:
        load(None, ["loss.terms=[ppo_clip, teacher_kl]"])
    # the known providers are named (a new teacher joins the list: it is not pinned whole)
    assert all(f"teacher '{t}'" in str(refused.value) for t in ("ema", "frozen", "model", "privileged"))
    load(None, ["loss.terms=[ppo_clip, {name: teacher_kl, weight: 0}]"])  # inactive: no teacher needed
    with pytest.raises(ConfigError, match=r"unknown field \{solution\}; allowed: \{prompt\}, \{reference\}"):
        load(None, ["teacher={name: privileged, context: '{prompt} {solution}'}"])
    with pytest.raises(ConfigError, match="privileged teacher needs a privileged context"):
        load(None, ["teacher={name: privileged, context: ''}"])
    with pytest.raises(ConfigError, match="decay=1.0"):
        load(None, ["teacher={name: ema, decay: 1.0}"])
    with pytest.raises(ConfigError, match="path: required"):
        load(None, ["teacher=model"])
    with pytest.raises(ValueError, match="uses {reference} but problem 'x' has none"):
        privileged_problem(Problem("x", "1+1", "2"), "{prompt}<ref>{reference}</ref>")
    chat = privileged_problem(Problem("y", ({"role": "system", "content": "s"}, {"role": "user", "content": "1+1"}),
                                      "2", reference="r"), "{prompt} (solution: {reference})")
    assert chat.prompt == ({"role": "system", "content": "s"}, {"role": "user", "content": "1+1 (solution: r)"})
