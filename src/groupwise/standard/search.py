"""``search``: multi-hop questions over a procedural knowledge base, answered with a BM25 search tool.

The knowledge base (fixed by ``kb_seed``, the same for every run seed) has people, cities and countries with
made-up names, one sentence per fact::

    Tamo lives in Varen.      Tamo plays chess.      Varen is in Osk.

A question asks for a person's city (1 hop) or country (2 hops): ``city of Tamo?`` / ``country of Tamo?``.
The answer is not in the prompt: the agent searches, through the ``search`` tool (BM25 over the sentences,
``bm25s``, the top ``top_k`` hits with a positive score, joined by spaces; ``no results`` otherwise). A
completion (the ``multi_turn`` builder runs it; ``rollout/multi_turn.py``) alternates model turns and tool
results::

    <search>Tamo lives</search><result>Tamo lives in Varen.</result><search>Varen is</search>
    <result>Varen is in Osk.</result><answer>Osk</answer>

The query matters: ``Tamo`` alone ranks the shorter hobby sentence first, and ``Varen`` ties the city's
sentence with every resident's, so the reference queries are ``<name> lives`` and ``<city> is``. Reward:
exact match of the last ``<answer>`` with the gold name. Held-out questions are about held-out people
(``test_frac`` of them), so their answers cannot be memorised from training: only searching answers them
(a guess of the country is right 1/``n_countries`` of the time).

Warm start: the reference traces above; ``p_guess`` of them instead answer at once with a random name of
the right kind (the removable flaw RL can fix: searching pays, guessing does not). ``tool_latency_s``
sleeps in every search (a simulated remote tool).
"""

from __future__ import annotations

import dataclasses
import random
import re
import time

from groupwise.registry import ConfigError
from groupwise.seeding import stable_seed
from groupwise.tasks import TASKS
from groupwise.types import Problem

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_FORMAT = re.compile(r"(<search>[^<]*</search><result>[^<]*</result>)*<answer>[^<]+</answer>")
HOBBIES = ("chess", "golf", "jazz", "poker", "tennis", "rugby")
_C, _V = "bdfgklmnprstvz", "aeiou"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
    n_people: int = 240
    n_cities: int = 24
    n_countries: int = 6
    min_hops: int = 1
    max_hops: int = 2
    """1: the person's city; 2: the country of that city (two searches)."""
    top_k: int = 1
    """Search hits returned per query."""
    test_frac: float = 0.2
    """Share of people whose questions are held out (never in training)."""
    p_guess: float = 0.0
    """Share of warm-start traces that answer at once with a random city / country (no search)."""
    tool_latency_s: float = 0.0
    kb_seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_hops <= self.max_hops <= 2:
            raise ValueError(f"min_hops={self.min_hops}, max_hops={self.max_hops}: need 1 <= min <= max <= 2")
        if not 2 <= self.n_countries <= self.n_cities <= self.n_people:
            raise ValueError(f"n_countries={self.n_countries}, n_cities={self.n_cities}, n_people={self.n_people}: "
                             "need 2 <= n_countries <= n_cities <= n_people")
        if self.n_people > 2000 or self.n_cities > 2000:
            raise ValueError(f"n_people={self.n_people}, n_cities={self.n_cities}: allowed up to 2000 (distinct names)")
        if not 0.0 < self.test_frac < 1.0:
            raise ValueError(f"test_frac={self.test_frac}: allowed 0 < test_frac < 1")
        if not 0.0 <= self.p_guess <= 1.0:
            raise ValueError(f"p_guess={self.p_guess}: a probability in [0, 1]")
        if self.top_k < 1 or self.tool_latency_s < 0:
            raise ValueError(f"top_k={self.top_k}, tool_latency_s={self.tool_latency_s}: need top_k >= 1, latency >= 0")


def _names(rng: random.Random, n: int, pattern: str, taken: set[str]) -> list[str]:
    """``n`` distinct names of consonant (C) / vowel (V) ``pattern``, none in ``taken``."""
    out: list[str] = []
    while len(out) < n:
        name = "".join(rng.choice(_C if ch == "C" else _V) for ch in pattern).capitalize()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


class Search:
    """The search task (see the module docstring). ``tools`` maps a tool name to ``query -> text``."""

    name = "search"

    def __init__(self, cfg: SearchConfig, seed: int = 0):
        c, self.cfg, self.seed = cfg, cfg, seed
        rng, taken = random.Random(stable_seed("search-kb", c.kb_seed)), set()
        countries = _names(rng, c.n_countries, "VCVC", taken)
        cities = _names(rng, c.n_cities, "CVCVC", taken)
        people = _names(rng, c.n_people, "CVCV", taken)
        self.country = {city: countries[i % len(countries)] for i, city in enumerate(cities)}  # every one used
        self.city = {p: cities[i % len(cities)] for i, p in enumerate(people)}
        rng.shuffle(people)
        hobby = {p: rng.choice(HOBBIES) for p in people}
        self.docs = ([f"{p} lives in {self.city[p]}." for p in people] + [f"{p} plays {hobby[p]}." for p in people]
                     + [f"{city} is in {self.country[city]}." for city in cities])
        self.cities, self.countries = cities, countries
        self._index = None
        held = set(people[:max(1, round(c.test_frac * len(people)))])
        hops = range(c.min_hops, c.max_hops + 1)
        self.test = [self._problem("test", p, h) for p in sorted(held) for h in hops]
        self.train = [self._problem("train", p, h) for p in sorted(set(people) - held) for h in hops]
        self.tools = {"search": self.search}

    def _problem(self, split: str, person: str, hops: int) -> Problem:
        city = self.city[person]
        answer = city if hops == 1 else self.country[city]
        reference = f"<search>{person} lives</search><result>{self._retrieve(person + ' lives', False)}</result>"
        if hops == 2:
            reference += f"<search>{city} is</search><result>{self._retrieve(city + ' is', False)}</result>"
        return Problem(id=f"search/{split}/{person}/{hops}", prompt=f"{'city' if hops == 1 else 'country'} of "
                       f"{person}?", answer=answer, difficulty=hops, reference=reference + f"<answer>{answer}</answer>",
                       meta={"person": person, "hops": hops})

    # ------------------------------------------------------------------------------------------ the tool
    def search(self, query: str) -> str:
        """The top ``top_k`` sentences for ``query`` by BM25 (score > 0), or ``no results``."""
        return self._retrieve(query, True)

    def _retrieve(self, query: str, timed: bool) -> str:
        if timed and self.cfg.tool_latency_s:
            time.sleep(self.cfg.tool_latency_s)
        bm25s = _bm25s()
        if self._index is None:
            self._index = bm25s.BM25()
            self._index.index(bm25s.tokenize(self.docs, stopwords=None, show_progress=False), show_progress=False)
        terms = bm25s.tokenize([query], stopwords=None, show_progress=False)
        if not re.search(r"\w", query) or not terms.vocab:
            return "no results"
        ids, scores = self._index.retrieve(terms, k=min(self.cfg.top_k, len(self.docs)), show_progress=False)
        hits = [self.docs[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]
        return " ".join(hits) if hits else "no results"

    # -------------------------------------------------------------------------------------- warm start
    def sft_examples(self, rng: random.Random, n: int) -> list[tuple[Problem, str]]:
        out = []
        for _ in range(n):
            p = self.train[rng.randrange(len(self.train))]
            if self.cfg.p_guess and rng.random() < self.cfg.p_guess:  # no draw at 0
                guess = rng.choice(self.cities if p.meta["hops"] == 1 else self.countries)
                out.append((p, f"<answer>{guess}</answer>"))
            else:
                out.append((p, p.reference))
        return out

    # ---------------------------------------------------------------------------------------- verifier
    def extract_answer(self, completion: str) -> str | None:
        found = _ANSWER.findall(completion)
        return found[-1].strip() if found else None

    def verify(self, problem: Problem, completion: str) -> bool:
        return self.extract_answer(completion) == problem.answer

    def format_ok(self, completion: str) -> bool:
        return _FORMAT.fullmatch(completion.strip()) is not None


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise ConfigError("task.name=search needs bm25s, which is not installed: "
                          "pip install 'groupwise[search]'") from None
    return bm25s


@TASKS.register("search", config=SearchConfig, provides=("tool:search",))
def search(cfg: SearchConfig, env) -> Search:
    _bm25s()  # refuse at load time, not at the first search
    return Search(cfg, env.seed)
