import random
import re

import pytest

from groupwise.standard.lab import FILLERS, Lab, LabConfig


@pytest.mark.parametrize(
    "text,ok,fmt",
    [
        ("<think>3+5=8;so 8.</think><answer>8</answer>", True, True),
        ("<answer>8</answer>", True, True),
        ("<NT><answer>8</answer>", True, True),
        ("<answer>8 </answer>", True, True),
        ("<think>so 8.</think><answer>9</answer>", False, True),
        ("<answer>9</answer><answer>8</answer>", True, False),  # the last answer counts; format wants one
        ("<answer>8</answer><answer>9</answer>", False, False),
        ("<answer>08</answer>", False, True),
        ("<answer>−8</answer>", False, True),
        ("<answer>8", False, False),
        ("8", False, False),
        ("", False, False),
        ("<answer></answer>", False, False),
        ("<think>8</think>", False, False),
        ("<answer>8</answer> extra", True, False),
    ],
)
def test_verifier_table(lab, text, ok, fmt):
    problem = next(p for p in lab.test if p.answer == "8")
    assert lab.verify(problem, text) is ok
    assert lab.format_ok(text) is fmt


def test_reference_traces_are_correct_and_arithmetic_is_left_to_right_mod_10(lab):
    for p in lab.test:
        assert lab.verify(p, p.reference) and lab.format_ok(p.reference)
        acc = int(p.prompt[0])
        for op, x in re.findall(r"([+\-*])(\d)", p.prompt):
            acc = {"+": acc + int(x), "-": acc - int(x), "*": acc * int(x)}[op] % 10
        assert str(acc) == p.answer


def test_held_out_never_in_train_and_difficulty_stratified():
    lab = Lab(LabConfig(test_size=60, min_steps=1, max_steps=3), seed=1)
    test = {p.prompt for p in lab.test}
    assert not any(lab.train[i].prompt in test for i in range(2000))
    assert sorted({p.difficulty for p in lab.test}) == [1, 2, 3]
    assert lab.train[17] == lab.train[17]


def test_pathology_rates_follow_the_config():
    rng = random.Random(0)
    clean = Lab(LabConfig(), 0)
    assert all(clean.verify(p, t) for p, t in clean.sft_examples(rng, 200))
    slips = Lab(LabConfig(p_wrap_slip=1.0, min_steps=3, max_steps=3), 0)
    pairs = slips.sft_examples(rng, 300)
    wrong = sum(not slips.verify(p, t) for p, t in pairs) / len(pairs)
    # every wrapping step is off by one; a chain of 3 steps over +- rarely avoids all wraps
    assert 0.6 < wrong < 1.0
    checks = Lab(LabConfig(max_checks=4), 0)
    counts = [t.count("chk ") for _, t in checks.sft_examples(rng, 400)]
    assert set(counts) == {0, 1, 2, 3, 4}
    assert all(t.index("so ") < t.index("chk ") for _, t in checks.sft_examples(rng, 50) if "chk " in t)


def test_drift_and_fix_traces():
    rng = random.Random(1)
    drift = Lab(LabConfig(p_drift=1.0), 0)
    for p, t in drift.sft_examples(rng, 50):
        assert t.count("so ") == 2 and "wait " in t and not drift.verify(p, t)
    fix = Lab(LabConfig(p_fix=1.0), 0)
    for p, t in fix.sft_examples(rng, 50):
        assert "wait " in t and fix.verify(p, t)


def test_filler_style_is_verbose_but_correct_and_the_privileged_view_terse():
    lab = Lab(LabConfig(p_filler=1.0, privileged_frac=0.5, ops="+", min_steps=3, max_steps=3), 0)
    pairs = lab.sft_examples(random.Random(2), 200)
    plain = [(p, t) for p, t in pairs if "<ref>" not in str(p.prompt)]
    assert 50 < len(plain) < 150
    for p, t in plain:  # 1-3 filler words after the commitment, the steps untouched; still verified
        steps, tail = t.split("so ", 1)
        assert not any(f in steps for f in FILLERS) and lab.verify(p, t)
        assert 1 <= sum(tail.count(f) for f in FILLERS) <= 3
    for p, t in pairs:  # the privileged view's target is the terse reference
        if "<ref>" in str(p.prompt):
            assert not any(f in t for f in FILLERS) and lab.verify(p, t)


def test_modes():
    lab = Lab(LabConfig(modes=True), 0)
    seen = {t[:4] for _, t in lab.sft_examples(random.Random(0), 60)}
    assert seen == {"<NT>", "<SH>", "<LG>"}
    assert all(lab.verify(p, t) for p, t in lab.sft_examples(random.Random(0), 60))


@pytest.mark.parametrize("kw,msg", [({"ops": "+/"}, "ops"), ({"p_slip": 1.5}, "p_slip"),
                                    ({"min_steps": 5, "max_steps": 2}, "min_steps")])
def test_bad_config(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LabConfig(**kw)


def test_privileged_warm_start_examples():
    import random

    from groupwise.standard.lab import Lab, LabConfig
    from groupwise.teachers import PRIVILEGED_CONTEXT

    plain, none = Lab(LabConfig(p_wrap_slip=0.6)), Lab(LabConfig(p_wrap_slip=0.6, privileged_frac=0.0))
    assert plain.sft_examples(random.Random(3), 20) == none.sft_examples(random.Random(3), 20)  # no extra draws at 0
    every = Lab(LabConfig(p_wrap_slip=0.6, privileged_frac=1.0)).sft_examples(random.Random(3), 5)
    for p, text in every:
        user, ref = p.prompt.split("\n<ref>")
        assert text == ref.removesuffix("</ref>") and "<think>" in text and PRIVILEGED_CONTEXT.endswith("</ref>")
    half = Lab(LabConfig(privileged_frac=0.5)).sft_examples(random.Random(0), 400)
    share = sum("<ref>" in str(p.prompt) for p, _ in half) / 400
    assert 0.4 < share < 0.6


def test_early_exit_examples_answer_after_a_clean_prefix():
    import random

    from groupwise.standard.lab import Lab, LabConfig

    lab = Lab(LabConfig(p_early_exit=1.0, min_steps=3, max_steps=3))
    for p, text in lab.sft_examples(random.Random(1), 20):
        think, answer = text.split("</think>")
        assert answer == f"<answer>{p.answer}</answer>" and p.reference.startswith(think)
        assert think.count(";") < 3 and "so " not in think  # 0..2 of the 3 steps, no commitment
    assert Lab(LabConfig()).sft_examples(random.Random(1), 20) == \
        Lab(LabConfig(p_early_exit=0.0)).sft_examples(random.Random(1), 20)


NOISY = dict(ops="+", min_steps=3, max_steps=3, test_size=64)


def test_label_noise_share_is_within_a_binomial_bound_and_fixed_per_prompt():
    lab = Lab(LabConfig(**NOISY, label_noise=0.2), seed=0)
    n = 4000
    problems = [lab.train[i] for i in range(n)]
    corrupted = [p for p in problems if "clean_answer" in p.meta]
    # Binomial(4000, 0.2): sd = sqrt(4000 * 0.2 * 0.8) = 25.3; 4 sd = 101 problems
    assert abs(len(corrupted) - 0.2 * n) < 4 * (n * 0.2 * 0.8) ** 0.5
    for p in corrupted:  # off by one mod 10, never the gold; the reference and the chain stay clean
        assert p.answer != p.meta["clean_answer"]
        assert (int(p.answer) - int(p.meta["clean_answer"])) % 10 in (1, 9)
        assert p.reference.endswith(f"<answer>{p.meta['clean_answer']}</answer>")
    assert {(int(p.answer) - int(p.meta["clean_answer"])) % 10 for p in corrupted} == {1, 9}
    # deterministic: the same index, another task object, another seed's stream: the same label per prompt
    again = Lab(LabConfig(**NOISY, label_noise=0.2), seed=0)
    assert [(p.prompt, p.answer) for p in problems[:500]] == [(again.train[i].prompt, again.train[i].answer)
                                                              for i in range(500)]
    label = {p.prompt: p.answer for p in problems}
    other = Lab(LabConfig(**NOISY, label_noise=0.2), seed=7)
    shared = [q for q in (other.train[i] for i in range(2000)) if q.prompt in label]
    assert len(shared) > 100 and all(q.answer == label[q.prompt] for q in shared)
    # nested: the prompts corrupted at 0.1 are a subset of those corrupted at 0.2
    low = Lab(LabConfig(**NOISY, label_noise=0.1), seed=0)
    assert ({low.train[i].prompt for i in range(n) if "clean_answer" in low.train[i].meta}
            < {p.prompt for p in corrupted})


def test_label_noise_never_touches_held_out_problems_or_the_warm_start():
    from groupwise.config import load
    from groupwise.models.warm_start import warm_start_key

    clean, noisy = Lab(LabConfig(**NOISY), seed=0), Lab(LabConfig(**NOISY, label_noise=0.5), seed=0)
    assert noisy.test == clean.test and not any("clean_answer" in p.meta for p in noisy.test)
    assert all(noisy.verify(p, p.reference) for p in noisy.test)
    assert noisy.sft_examples(random.Random(4), 200) == clean.sft_examples(random.Random(4), 200)
    m = load(None).model
    assert warm_start_key("lab-tiny", noisy, m) == warm_start_key("lab-tiny", clean, m)


def test_the_verifier_rewards_the_corrupted_label_not_the_clean_one():
    lab = Lab(LabConfig(**NOISY, label_noise=0.2), seed=0)
    p = next(q for q in (lab.train[i] for i in range(200)) if "clean_answer" in q.meta)
    assert lab.verify(p, f"<answer>{p.answer}</answer>")
    assert not lab.verify(p, f"<answer>{p.meta['clean_answer']}</answer>")
    assert not lab.verify(p, p.reference)  # the clean trace ends at the clean gold


def test_label_noise_zero_leaves_the_problems_identical():
    default, zero = Lab(LabConfig(**NOISY), seed=3), Lab(LabConfig(**NOISY, label_noise=0.0), seed=3)
    for i in range(300):
        a, b = default.train[i], zero.train[i]
        assert a == b and a.meta == b.meta and "clean_answer" not in a.meta


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_label_noise_outside_its_range_is_one_line_naming_the_key(value):
    with pytest.raises(ValueError, match=r"^label_noise=.*allowed \[0, 1\)[^\n]*$"):
        LabConfig(label_noise=value)


def test_correct_on_splits_the_verdict_by_corrupted_and_clean_labels():
    import torch

    from groupwise.standard.rewards import CorrectOnConfig, correct_on
    from groupwise.types import Group, Sample

    lab = Lab(LabConfig(**NOISY, label_noise=0.2), seed=0)
    items = [lab.train[i] for i in range(200)]
    bad = next(p for p in items if "clean_answer" in p.meta)
    good = next(p for p in items if "clean_answer" not in p.meta)

    def sample(correct):
        return Sample(prompt_ids=torch.tensor([1]), completion_ids=torch.tensor([2]), rollout_logprobs=torch.zeros(1),
                      loss_mask=torch.ones(1, dtype=torch.bool), finish_reason="stop", correct=correct)

    groups = [Group(bad, [sample(True), sample(False)]), Group(good, [sample(False), sample(True)])]
    assert correct_on(CorrectOnConfig(labels="corrupted"), None)(groups, 0) == [[1.0, 0.0], [None, None]]
    assert correct_on(CorrectOnConfig(labels="clean"), None)(groups, 0) == [[None, None], [0.0, 1.0]]


@pytest.mark.parametrize(
    "text,credit",
    [
        ("<think>3+5=8;8-2=6;6+7=3;so 3.</think><answer>3</answer>", 1.0),
        ("<think>3+5=8;8-2=5;5+7=2;so 2.</think><answer>2</answer>", 1 / 3),  # a slip costs the steps after it
        ("<think>3+5=9;wait 3+5=8;8-2=6;6+7=3;so 3.</think><answer>3</answer>", 1.0),  # the retracted step drops
        ("<think>3+5=9;8-2=6;6+7=3;so 3.</think><answer>3</answer>", 2 / 3),
        ("<think>3+5=8;8-2=6;6+7=3;so 3.chk 6+7=4;wait 6+7=4;so 4.</think><answer>4</answer>", 1.0),  # after so
        ("<think>3+5=8;</think><answer>8</answer>", 1 / 3),
        ("<answer>3</answer>", 0.0),
        ("", 0.0),
    ],
)
def test_step_credit_is_the_share_of_running_values_written_at_their_step(text, credit):
    from groupwise.types import Problem

    problem = Problem(id="p", prompt="3+5-2+7", answer="3", difficulty=3,
                      meta={"xs": (3, 5, 2, 7), "ops": ("+", "-", "+")})
    assert Lab(LabConfig(), seed=0).step_credit(problem, text) == pytest.approx(credit, abs=1e-12)


def test_step_credit_reward_is_full_on_reference_traces_and_needs_the_task_method():
    import types

    import torch

    from groupwise.config import load
    from groupwise.registry import ConfigError, NoConfig
    from groupwise.standard.rewards import step_credit
    from groupwise.types import Group, Sample

    lab = Lab(LabConfig(**NOISY, label_noise=0.2), seed=0)
    items = [lab.train[i] for i in range(50)]

    def sample(text):
        return Sample(prompt_ids=torch.tensor([1]), completion_ids=torch.tensor([2]), rollout_logprobs=torch.zeros(1),
                      loss_mask=torch.ones(1, dtype=torch.bool), finish_reason="stop", text=text)

    got = step_credit(NoConfig(), types.SimpleNamespace(task=lab))([Group(p, [sample(p.reference)]) for p in items], 0)
    assert got == [[1.0]] * len(items)  # corrupted labels included: the credit is the clean chain's
    with pytest.raises(ConfigError, match=r"reward 'step_credit' requires 'step_credit'.*allowed: add task 'lab'"):
        load(None, ["task=search", "reward.terms=[step_credit]"])  # refused at load, before any model
