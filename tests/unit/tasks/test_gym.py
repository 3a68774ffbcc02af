import dataclasses
import random
import sys

import pytest

pytest.importorskip("reasoning_gym")

from groupwise.registry import BuildEnv  # noqa: E402
from groupwise.standard.gym import DEFAULT_SYSTEM_PROMPT, GymConfig, GymTask, running_totals  # noqa: E402
from groupwise.tasks import TASKS  # noqa: E402
from groupwise.tasks.base import PromptForm  # noqa: E402

TINY = {
    "max_digits": 1,
    "max_terms": 2,
    "operators": ("+", "-"),
    "allow_parentheses": False,
    "allow_negation": False,
}  # 242 distinct questions: train/test collisions are likely


@pytest.fixture(scope="module", params=["basic_arithmetic", "chain_sum"])
def task(request):
    return GymTask(GymConfig(dataset=request.param, size=20, test_size=5), seed=0)


def test_registered_with_its_config():
    entry = TASKS.get("reasoning_gym")
    assert entry.config is GymConfig
    assert isinstance(entry.build(GymConfig(size=2, test_size=1), BuildEnv(run=None, seed=0)), GymTask)


def test_right_answer_true_wrong_false(task):
    for p in [*task.test, task.train[0], task.train[19]]:
        wrong = str(int(p.answer) + 1)
        assert task.verify(p, f"<think>easy</think><answer>{p.answer}</answer>")
        assert task.verify(p, f"<answer> {p.answer} </answer>")
        assert not task.verify(p, f"<answer>{wrong}</answer>")
        assert not task.verify(p, f"<answer>{p.answer}</answer> no wait <answer>{wrong}</answer>")
        assert not task.verify(p, p.answer)  # no answer tag
        assert task.score(p, "") == 0.0


def test_problems_carry_the_entry_and_chat_prompt(task):
    p = task.test[0]
    entry = p.meta["entry"]
    assert p.answer == entry["answer"] and p.id == f"reasoning_gym/{task.cfg.dataset}/test/0"
    assert p.prompt == (
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": entry["question"]},
    )
    assert p.difficulty == 0  # metadata["difficulty"] is a dict of ranges, not a number
    assert GymTask(dataclasses.replace(task.cfg, system_prompt=""), 0).test[0].prompt == entry["question"]


def test_substring_partial_credit_is_not_correct_at_min_score_1():
    task = GymTask(GymConfig(dataset="chain_sum", size=2, test_size=1), 0)
    base = task.test[0]
    p = dataclasses.replace(base, answer="6", meta={"entry": {**base.meta["entry"], "answer": "6"}})
    assert task.score(p, "<answer>16</answer>") == 0.5  # reasoning-gym: len("6") / len("16")
    assert not task.verify(p, "<answer>16</answer>")
    assert task.verify(p, "<answer>6</answer>")
    lenient = GymTask(GymConfig(dataset="chain_sum", size=2, test_size=1, min_score=0.5), 0)
    assert lenient.verify(p, "<answer>16</answer>")


def test_format_and_extraction(task):
    assert task.extract_answer("<answer>1</answer> then <answer> 7 </answer>") == "7"
    assert task.format_ok("<answer>7</answer>")
    assert not task.format_ok("<answer></answer>") and not task.format_ok("7")


SHOTS = (("Calculate 3 + 4.", "3 + 4 = 7. The final answer is \\boxed{7}."),
         ("Calculate 12 - 5.", "12 - 5 = 7. The final answer is \\boxed{7}."))


def test_few_shot_examples_are_earlier_chat_turns():
    task = GymTask(GymConfig(size=2, test_size=1, system_prompt="Box it.", few_shot=SHOTS), 0)
    question = task.test[0].meta["entry"]["question"]
    assert task.test[0].prompt == (
        {"role": "system", "content": "Box it."},
        {"role": "user", "content": "Calculate 3 + 4."},
        {"role": "assistant", "content": "3 + 4 = 7. The final answer is \\boxed{7}."},
        {"role": "user", "content": "Calculate 12 - 5."},
        {"role": "assistant", "content": "12 - 5 = 7. The final answer is \\boxed{7}."},
        {"role": "user", "content": question},
    )
    no_system = GymTask(GymConfig(size=2, test_size=1, system_prompt="",
                                  few_shot=SHOTS[:1]), 0).test[0].prompt
    assert [m["role"] for m in no_system] == ["user", "assistant", "user"]


FORMS = (
    PromptForm(name="shots", system_prompt="Box it.", few_shot=(("Calculate 3 + 4.", "\\boxed{7}"),)),
    PromptForm(name="words", system_prompt="Write the running total, then box it."),
    PromptForm(name="plain", template="Q: {question} Box the answer, e.g. \\boxed{{7}}.", train=False),
)


def test_prompt_forms_train_draws_training_forms_and_eval_cycles_every_form():
    task = GymTask(GymConfig(size=60, test_size=6, prompt_forms=FORMS), seed=0)
    assert [p.meta["form"] for p in task.test] == ["shots", "words", "plain"] * 2  # test problem i: form i mod 3
    train = [p.meta["form"] for p in task.train]
    assert set(train) == {"shots", "words"}  # the held-out form never trains
    assert train == [p.meta["form"] for p in GymTask(GymConfig(size=60, test_size=6, prompt_forms=FORMS), 0).train]
    assert train != [p.meta["form"] for p in GymTask(GymConfig(size=60, test_size=6, prompt_forms=FORMS), 1).train]
    q = task.test[2].meta["entry"]["question"]
    assert task.test[2].prompt == f"Q: {q} Box the answer, e.g. \\boxed{{7}}."  # no system, no shots: plain text
    assert task.test[0].prompt == ({"role": "system", "content": "Box it."},
                                   {"role": "user", "content": "Calculate 3 + 4."},
                                   {"role": "assistant", "content": "\\boxed{7}"},
                                   {"role": "user", "content": task.test[0].meta["entry"]["question"]})
    assert task.test[1].prompt[0]["content"].startswith("Write the running total")
    one = GymTask(GymConfig(size=2, test_size=4, prompt_forms=FORMS, eval_form="plain"), 0)
    assert [p.meta["form"] for p in one.test] == ["plain"] * 4
    assert [p.meta["entry"]["question"] for p in one.test] == [p.meta["entry"]["question"] for p in task.test[:4]]


@pytest.mark.parametrize("kwargs,message", [
    ({"prompt_forms": FORMS[:1] * 2}, r"prompt_forms: names must be unique"),
    ({"prompt_forms": FORMS[2:]}, r"prompt_forms: at least one form must have train: true"),
    ({"prompt_forms": FORMS, "eval_form": "chat"}, r"eval_form='chat': allowed '' \(cycle every form\) or one of "
                                                  r"shots, words, plain"),
    ({"prompt_forms": FORMS, "few_shot": (("a", "b"),)}, r"few_shot: give worked examples inside each of"),
    ({"eval_form": "plain"}, r"eval_form='plain': names one of prompt_forms, and there are none; allowed: ''"),
])
def test_prompt_form_errors_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        GymConfig(**kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs,message", [
    ({"name": ""}, r"name: required"),
    ({"name": "x", "template": "no question"}, r"must contain \{question\}"),
    ({"name": "x", "template": "{question} {other}"}, r"not a valid template"),
])
def test_prompt_form_own_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromptForm(**kwargs)


def test_math_verify_scorer_reads_boxed_answers_all_or_nothing():
    task = GymTask(GymConfig(dataset="chain_sum", size=2, test_size=1, scorer="math_verify"), 0)
    base = task.test[0]
    p = dataclasses.replace(base, answer="-41", meta={"entry": {**base.meta["entry"], "answer": "-41"}})
    assert task.verify(p, "21 - 62 = -41. The final answer is \\boxed{-41}.")
    assert task.verify(p, "\\boxed{-41.0}")  # math-verify: numerically equal
    assert task.verify(p, "<answer>-41</answer>")
    assert not task.verify(p, "\\boxed{41}") and task.score(p, "\\boxed{41}") == 0.0  # no substring credit
    assert not task.verify(p, "The answer is -41.")  # no boxed or tagged answer: no answer
    assert not task.verify(p, "\\boxed{-41} wait, \\boxed{-40}")  # the last box answers
    assert task.extract_answer("so \\boxed{7}.") == "7" and task.format_ok("\\boxed{7}")
    assert not task.format_ok("7")


def test_seeds_and_held_out_disjointness():
    a = GymTask(GymConfig(size=300, test_size=40, dataset_args=TINY), seed=0)
    b = GymTask(GymConfig(size=300, test_size=40, dataset_args=TINY), seed=1)
    a2 = GymTask(GymConfig(size=300, test_size=40, dataset_args=TINY), seed=0)
    q = lambda ps: [p.meta["entry"]["question"] for p in ps]  # noqa: E731
    assert q(a.test) == q(b.test)  # the test split does not depend on the run seed
    assert q(a.train) == q(a2.train) and q(a.train) != q(b.train)
    raw = [a._spare(0)[i]["question"] for i in range(300)]  # the train dataset before reseeding
    assert not set(raw).isdisjoint(q(a.test))
    assert set(q(a.train)).isdisjoint(q(a.test))  # collisions were reseeded away
    assert len(a.train) == 300 and a.train[-1] == a.train[299]
    assert [p.id for p in a.train[:3]] == [f"reasoning_gym/basic_arithmetic/train/{i}" for i in range(3)]


def test_difficulty_key_reads_numeric_metadata():
    task = GymTask(GymConfig(dataset="chain_sum", size=5, test_size=5, difficulty_key="num_terms"), 0)
    assert [p.difficulty for p in task.test] == [p.meta["entry"]["metadata"]["num_terms"] for p in task.test]
    assert any(p.difficulty > 0 for p in task.test)


def test_running_totals_reference_works_the_chain_left_to_right():
    entry = {"answer": "17", "metadata": {"expression": "25 - 47 + 9 + 30"}}  # 25-47 = -22, +9 = -13, +30 = 17
    assert running_totals(entry, "basic_arithmetic") == (
        "25 - 47 = -22. -22 + 9 = -13. -13 + 30 = 17. The final answer is \\boxed{17}.")
    assert running_totals({"answer": "-4", "metadata": {"expression": "-1 - 3"}}, "x") == (
        "-1 - 3 = -4. The final answer is \\boxed{-4}.")
    assert running_totals(entry, "basic_arithmetic", check=True) == (
        "25 - 47 = -22. -22 + 9 = -13. -13 + 30 = 17. Check: -13 + 30 = 17. The final answer is \\boxed{17}.")
    for expr, answer, message in [("4 * 3 - 1", "11", "not integers joined by"), ("7", "7", "not integers joined by"),
                                  ("(2 + 3) - 1", "4", "not integers joined by"), ("2 + 3", "6", "gives 5")]:
        with pytest.raises(ValueError, match=message):
            running_totals({"answer": answer, "metadata": {"expression": expr}}, "basic_arithmetic")


def test_reference_running_totals_fills_problems_and_sft_examples():
    chains = {"max_terms": 4, "max_digits": 2, "operators": ("+", "-"), "allow_parentheses": False,
              "allow_negation": False}
    task = GymTask(GymConfig(size=20, test_size=4, reference="running_totals", dataset_args=chains), seed=0)
    for p in [*task.test, *task.train[:5]]:
        assert p.reference.endswith(f"\\boxed{{{p.answer}}}.") and p.reference.count(" = ") >= 1
    pairs = task.sft_examples(random.Random(0), 3)
    assert len(pairs) == 3 and all(text == p.reference for p, text in pairs)
    checked = GymTask(GymConfig(size=20, test_size=4, reference="running_totals_check", dataset_args=chains), seed=0)
    assert [p.reference.replace(p.reference[p.reference.index(" Check:"):p.reference.index(" The final")], "")
            for p in checked.test] == [p.reference for p in task.test]  # the same traces plus the check
    assert GymTask(GymConfig(size=2, test_size=1), 0).test[0].reference == ""  # none: no reference
    with pytest.raises(ValueError, match=r"reference=running_totals: basic_arithmetic expression .* is not integers"):
        GymTask(GymConfig(size=2, test_size=8, reference="running_totals"), 0)  # parentheses by default: refused


def test_running_totals_two_operations_a_sentence():
    entry = {"answer": "17", "metadata": {"expression": "25 - 47 + 9 + 30"}}  # 25-47+9 = -13, +30 = 17
    assert running_totals(entry, "x", per_sentence=2) == (
        "25 - 47 + 9 = -13. -13 + 30 = 17. The final answer is \\boxed{17}.")
    assert running_totals({"answer": "5", "metadata": {"expression": "1 + 2 + 3 - 1"}}, "x", per_sentence=2) == (
        "1 + 2 + 3 = 6. 6 - 1 = 5. The final answer is \\boxed{5}.")
    assert running_totals({"answer": "1", "metadata": {"expression": "4 - 3"}}, "x", per_sentence=2) == (
        "4 - 3 = 1. The final answer is \\boxed{1}.")


def test_modes_tag_the_warm_up_traces():
    chains = {"min_terms": 3, "max_terms": 5, "max_digits": 1, "operators": ("+", "-"), "allow_parentheses": False,
              "allow_negation": False}
    cfg = GymConfig(size=50, test_size=4, reference="running_totals_check", dataset_args=chains, scorer="math_verify")
    plain, modes = GymTask(cfg, seed=0), GymTask(dataclasses.replace(cfg, modes=True), seed=0)
    pairs = modes.sft_examples(random.Random(0), 60)
    assert [p.id for p, _ in pairs] == [p.id for p, _ in plain.sft_examples(random.Random(0), 60)]  # same problems
    by_mode: dict = {}
    for p, text in pairs:
        tag, trace = text.split(" ", 1)
        by_mode.setdefault(tag, []).append((p, trace))
        assert modes.verify(p, text) and p.reference == plain.train[int(p.id.rsplit("/", 1)[1])].reference
    assert sorted(by_mode) == ["<LG>", "<NT>", "<SH>"] and all(len(v) >= 10 for v in by_mode.values())
    for p, trace in by_mode["<NT>"]:
        assert trace == f"The final answer is \\boxed{{{p.answer}}}."
    for p, trace in by_mode["<SH>"]:  # 3-5 terms: 1-2 sentences of two operations, no check
        assert trace == running_totals(p.meta["entry"], "basic_arithmetic", per_sentence=2) and "Check" not in trace
        assert trace.count(" = ") == p.meta["entry"]["metadata"]["num_terms"] // 2  # ceil(operations / 2)
    for p, trace in by_mode["<LG>"]:
        assert trace == p.reference and "Check:" in trace
    with pytest.raises(ValueError, match="modes=true needs reference: running_totals_check"):
        GymConfig(reference="running_totals", modes=True)


def test_sft_examples_not_available():
    with pytest.raises(NotImplementedError, match="no reference solutions"):
        GymTask(GymConfig(size=2, test_size=1), 0).sft_examples(random.Random(0), 1)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"dataset": "chain_summ"},
            r"dataset='chain_summ': unknown reasoning_gym dataset \(did you mean 'chain_sum'\?\)",
        ),
        ({"dataset": "zzzzzz"}, r"unknown reasoning_gym dataset; e\.g\. basic_arithmetic, chain_sum"),
        (
            {"dataset_args": {"max_digit": 1}},
            r"dataset_args\.max_digit: not a basic_arithmetic option.*max_digits",
        ),
        ({"dataset_args": {"seed": 1}}, r"dataset_args\.seed: not a basic_arithmetic option"),
        ({"dataset_args": {"max_digits": 0}}, r"dataset_args for 'basic_arithmetic': "),
        ({"dataset": ""}, r"dataset: required"),
        ({"size": 0}, r"size=0"),
        ({"min_score": 0.0}, r"min_score=0.0"),
        ({"min_score": 1.5}, r"min_score=1.5"),
        ({"scorer": "exact"}, r"scorer='exact': allowed dataset, math_verify"),
        ({"reference": "steps"}, r"reference='steps': allowed none, running_totals, running_totals_check"),
        ({"few_shot": (("Calculate 1 + 1.",),)}, r"few_shot\.0: allowed a \[question, worked answer\] pair"),
        (
            {"few_shot": (("Calculate 1 + 1.", " "),)},
            r"few_shot\.0: allowed a \[question, worked answer\] pair",
        ),
    ],
)
def test_config_errors_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        GymConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_missing_reasoning_gym_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    cfg = GymConfig()  # without the package the name is not checked at config time
    with pytest.raises(ImportError, match=r"pip install 'groupwise\[gym\]'"):
        GymTask(cfg, 0)
