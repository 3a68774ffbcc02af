"""The search task: a fixed procedural knowledge base, held-out people, BM25 behaviour the reference queries
rely on, exact-match verification, the guessing flaw of the warm start, and load-time errors."""

import random
import sys
import time

import pytest

from groupwise.config import load
from groupwise.registry import ConfigError
from groupwise.standard.search import Search, SearchConfig

pytest.importorskip("bm25s")


@pytest.fixture(scope="module")
def task():
    return Search(SearchConfig())


def test_kb_is_fixed_by_kb_seed_and_test_people_never_train(task):
    assert Search(SearchConfig(), seed=7).docs == task.docs  # the run seed does not change the world
    assert Search(SearchConfig(kb_seed=1)).docs != task.docs
    train_people = {p.meta["person"] for p in task.train}
    test_people = {p.meta["person"] for p in task.test}
    assert not train_people & test_people and len(test_people) == 48  # 20% of 240
    assert len(task.test) == 96 and {p.difficulty for p in task.test} == {1, 2}


def test_every_answer_is_found_by_the_reference_searches(task):
    for p in [*task.train[:50], *task.test]:
        person = p.meta["person"]
        city = task.city[person]
        assert task.search(f"{person} lives") == f"{person} lives in {city}."
        if p.difficulty == 2:
            assert task.search(f"{city} is") == f"{city} is in {p.answer}."
        assert p.answer == (city if p.difficulty == 1 else task.country[city])
        assert task.verify(p, p.reference) and task.format_ok(p.reference)


def test_the_query_matters(task):
    person = task.test[0].meta["person"]
    assert task.search(person).startswith(f"{person} plays ")  # the shorter hobby sentence ranks first
    assert task.search("Zzzz") == "no results" and task.search("") == "no results" and task.search("?!") == "no results"
    two = Search(SearchConfig(top_k=2)).search(f"{person} lives")
    assert two.startswith(f"{person} lives in ") and two.count(".") == 2


def test_verify_is_exact_match_on_the_last_answer(task):
    p = task.test[0]
    assert task.verify(p, f"<answer>x</answer><answer>{p.answer}</answer>")
    assert not task.verify(p, f"<answer>{p.answer.lower()}</answer>")
    assert not task.verify(p, f"<result>{p.answer}</result>")
    assert not task.format_ok(f"{p.answer}")


def test_guessing_traces_and_latency():
    t = Search(SearchConfig(p_guess=1.0, tool_latency_s=0.05))
    for p, text in t.sft_examples(random.Random(0), 20):
        assert text.startswith("<answer>") and "<search>" not in text
        assert text[8:-9] in (t.cities if p.difficulty == 1 else t.countries)
    t0 = time.monotonic()
    t.tools["search"]("Bada lives")
    assert time.monotonic() - t0 >= 0.05
    clean = Search(SearchConfig())
    assert all(text == p.reference for p, text in clean.sft_examples(random.Random(0), 20))


def test_bad_settings_are_one_line_errors(monkeypatch):
    with pytest.raises(ConfigError, match="task: min_hops=0, max_hops=2: need 1 <= min <= max <= 2"):
        load(None, ["task.name=search", "task.min_hops=0"])
    with pytest.raises(ConfigError, match="p_guess=2.0: a probability"):
        load(None, ["task.name=search", "task.p_guess=2"])
    from groupwise.loop.setup import build

    monkeypatch.setitem(sys.modules, "bm25s", None)
    with pytest.raises(ConfigError, match=r"task.name=search needs bm25s.*pip install 'groupwise\[search\]'"):
        build(load(None, ["task.name=search", "model.warm_start=false"]))
