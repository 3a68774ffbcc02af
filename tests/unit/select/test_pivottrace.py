import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.pivottrace.attention import attention_maps, eager_attention
from groupwise.methods.pivottrace.selector import (
    PivotTraceConfig,
    PivotTraceSelector,
    Probe,
    attention_shift,
    auroc,
    cue_positions,
    detect_pivots,
    gate,
    js_divergence,
    majority,
    pivot_density,
    route,
    spearman,
)
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import BuildEnv, ConfigError
from groupwise.rollout.base import RolloutContext, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.select import SELECTORS
from groupwise.standard.hf import HFConfig, HFGenerator
from groupwise.standard.random_selector import RandomSelector
from groupwise.tasks.base import render_prompt

LN2 = math.log(2)


# --------------------------------------------------------------------------------- formulas
def test_js_divergence_pinned():
    # p=[1,0], q=[.5,.5]: m=[.75,.25]; KL(p‖m)=ln(4/3)=.2876821; KL(q‖m)=.5 ln(2/3)+.5 ln 2=.1438410 → JS=.2157616
    js = js_divergence(torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    assert_close(js, torch.tensor([0.5 * (math.log(4 / 3) + 0.5 * math.log(2 / 3) + 0.5 * LN2)], dtype=torch.float64),
                 rtol=0, atol=1e-12)
    same = js_divergence(torch.tensor([[0.2, 0.8]]), torch.tensor([[2.0, 8.0]]))  # renormalised: identical
    disjoint = js_divergence(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]))
    assert_close(same, torch.zeros(1), rtol=0, atol=1e-7)
    assert_close(disjoint, torch.tensor([LN2]), rtol=0, atol=1e-6)


def hand_rows():
    # three consecutive queries at positions 1, 2, 3 over 4 keys (causal: row t sees keys <= its position)
    return torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.5, 0.0], [0.5, 0.0, 0.0, 0.5]], dtype=torch.float64)


def test_attention_shift_js_pinned():
    # d_1: row1 on shared keys {0,1} = [.25,.25] → [.5,.5] = row0 → 0.
    # d_2: row2 on keys {0,1,2} = [.5,0,0] → [1,0,0]; row1 = [.25,.25,.5]; m=[.625,.125,.25]
    #      KL(p‖m)=ln(1/.625)=.4700036; KL(q‖m)=.25 ln(.4)+.25 ln 2+.5 ln 2=.2907877 → JS=.3803957
    d = attention_shift(hand_rows(), first_query=1, prompt_end=1, scorer="js")
    kl_q = 0.25 * math.log(0.4) + 0.25 * LN2 + 0.5 * LN2
    assert_close(d, torch.tensor([0.0, 0.5 * (math.log(1.6) + kl_q)], dtype=torch.float64), rtol=0, atol=1e-12)


def test_attention_shift_lookback_pinned():
    # window 1: m_t = mass on keys < max(prompt_end=1, q_t − 1): row0 (q=1) .5, row1 (q=2) .25, row2 (q=3) .5
    d = attention_shift(hand_rows(), first_query=1, prompt_end=1, scorer="lookback", window=1)
    assert_close(d, torch.tensor([0.25, 0.25], dtype=torch.float64), rtol=0, atol=1e-12)


def focus_rows(t_len: int, first_query: int, switches: dict[int, int], base_focus: int = 0) -> torch.Tensor:
    """Rows with 0.9 on a focus key and 0.1 spread uniformly over the visible keys; the focus key changes at
    the token positions in ``switches`` (token -> new focus) and stays there (an abrupt, lasting shift)."""
    k = first_query + t_len
    rows = torch.zeros(t_len, k, dtype=torch.float64)
    focus = base_focus
    for t in range(t_len):
        focus = switches.get(t, focus)
        q = first_query + t
        rows[t, :q + 1] = 0.1 / (q + 1)
        rows[t, focus] += 0.9
    return rows


def test_detector_finds_injected_abrupt_shifts_exactly():
    rows = focus_rows(40, 20, {12: 5, 28: 17})
    d = attention_shift(rows, 20, 20)
    assert [i + 1 for i in detect_pivots(d, kappa=2.0, min_gap=8, min_shift=0.02)] == [12, 28]


def test_constant_and_slowly_drifting_attention_give_no_pivots():
    const = torch.tensor([1.0, 0.5, 0.25, 0.2, 0.1, 0.1]).repeat(30, 1).double()
    assert detect_pivots(attention_shift(const, 0, 0, "js"), min_shift=0.0) == []
    # the focus weight slides from key 0 to key 1 by 1/30 per row: smooth drift, every d tiny
    drift = torch.zeros(30, 40, dtype=torch.float64)
    for t in range(30):
        drift[t, 0], drift[t, 1], drift[t, 2:10 + t] = 0.8 * (1 - t / 29), 0.8 * t / 29, 0.2 / (8 + t)
    d = attention_shift(drift, 9, 9)
    assert float(d.max()) < 0.02 and detect_pivots(d, min_shift=0.02) == []
    assert detect_pivots(d, min_shift=0.0) == [0, 28]  # without the floor the robust threshold alone fires


def test_detector_local_max_plateau_and_merging():
    d = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0])
    # plateau at 2-3 → one pivot at its left end; 7 is within min_gap 8 of 2 (weaker) → merged; 17 is kept
    assert detect_pivots(d, kappa=2.0, min_gap=8) == [2, 17]
    assert detect_pivots(d, kappa=2.0, min_gap=4) == [2, 7, 17]
    assert detect_pivots(d, kappa=2.0, min_gap=4, min_shift=0.95) == [2]


def test_lexical_gate():
    cues = cue_positions(list("3+4=8;wait 3+4=7;"), ("wait", "chk"))
    assert cues == {6, 7, 8, 9}
    assert gate([3, 5, 11, 12, 15], cues, window=2) == [5, 11]


def test_pivot_density_pinned_and_length_normalised():
    assert pivot_density([2, 0], [50, 25]) == pytest.approx((4.0 + 0.0) / 2, abs=1e-12)
    assert pivot_density([1], [0]) == 0.0
    rows = focus_rows(40, 20, {12: 5, 28: 17})
    d = attention_shift(rows, 20, 20)
    once = pivot_density([len(detect_pivots(d))], [40])
    twice = pivot_density([len(detect_pivots(torch.cat([d, d[:1], d])))], [80])  # the trace repeated
    assert once == pytest.approx(5.0) and twice == pytest.approx(once)


def test_majority_and_ties():
    assert majority(["3", "3", "5", None]) == ("3", 0.5)
    assert majority(["5", "3"]) == ("3", 0.5)  # tie → smallest string
    assert majority([None, None]) == (None, 0.0)


def test_router_quantiles_on_uniform_scores_and_ties():
    scores = {i: i / 100 for i in range(100)}
    r = route(scores, n_gold=30, skip_frac=0.2, order=("pseudo", "gold", "skip"))
    assert [r[i] for i in range(100)] == ["pseudo"] * 50 + ["gold"] * 30 + ["skip"] * 20  # q_lo .5, q_hi .8
    alt = route(scores, n_gold=30, skip_frac=0.2, order=("skip", "pseudo", "gold"))
    assert [alt[i] for i in range(100)] == ["skip"] * 20 + ["pseudo"] * 50 + ["gold"] * 30
    tied = route(dict.fromkeys([7, 3, 5, 1], 0.5), n_gold=2, skip_frac=0.25, order=("pseudo", "gold", "skip"))
    assert tied == {1: "pseudo", 3: "gold", 5: "gold", 7: "skip"}  # ties broken by id
    full = route(scores, n_gold=100, skip_frac=0.2, order=("pseudo", "gold", "skip"))
    assert set(full.values()) == {"gold"}  # the budget wins over skip_frac


def test_spearman_and_auroc_pinned():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8, abs=1e-12)  # 1 − 6·2/(4·15)
    # ties: ranks x=[1.5,1.5,3], y=[1,2,3]: cov 1.5, var 1.5 and 2 → 1.5/sqrt(3)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3), abs=1e-12)
    assert math.isnan(spearman([1, 1], [1, 2]))
    assert auroc([0.9, 0.4, 0.4, 0.1], [True, True, False, False]) == pytest.approx(3.5 / 4, abs=1e-12)
    assert math.isnan(auroc([0.1, 0.2], [True, True]))


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("budget", [1.5, 0.0, -0.2])
def test_bad_budget_fails_at_load_with_one_line(budget):
    with pytest.raises(ConfigError) as e:
        load(None, ["select.name=pivottrace", f"select.label_budget={budget}"])
    assert "label_budget" in str(e.value) and "\n" not in str(e.value)


def test_bad_order_fails():
    with pytest.raises(ValueError, match="order"):
        PivotTraceConfig(order=("gold", "gold", "skip"))


# ---------------------------------------------------------------------------------- attention
def test_attention_maps_for_tiny_model_and_sdpa_equals_eager(tiny_model, tokenizer):
    prompts = [torch.tensor(tokenizer.encode(t, add_special_tokens=False)) for t in ("3+4-2\n", "1+1\n")]
    comps = [torch.tensor(tokenizer.encode(t, add_special_tokens=False)) for t in ("<think>3+4=7;", "<answer>2")]
    packed = pack(prompts, comps, tokenizer.pad_token_id)
    assert tiny_model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        lp_sdpa = completion_logprobs(tiny_model, packed).logprobs
    lp, ent, att = attention_maps(tiny_model, packed)
    assert tiny_model.config._attn_implementation == "sdpa"  # restored
    assert_close(lp, lp_sdpa, rtol=0, atol=1e-5)
    n_layers, heads = tiny_model.config.num_hidden_layers, tiny_model.config.num_attention_heads
    s = packed.input_ids.shape[1]
    assert att.shape == (n_layers, 2, heads, s, s) and ent.shape == lp.shape
    real = packed.attention_mask.bool()
    sums = att.sum(-1).permute(0, 2, 1, 3)[:, :, real]  # [L, H, real queries]: every real row is a distribution
    assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-5)
    pad_keys = att[:, 1][:, :, real[1]][..., ~real[1]]  # ... with no mass on padded keys (row 1 is left-padded)
    assert pad_keys.numel() > 0 and float(pad_keys.abs().max()) == 0.0
    assert attention_maps(tiny_model, packed, layers=[-1])[2].shape[0] == 1
    with eager_attention(tiny_model):
        assert tiny_model.config._attn_implementation == "eager"
    assert tiny_model.config._attn_implementation == "sdpa"


# ----------------------------------------------------------------------------------- selector
class ListTask:
    def __init__(self, problems):
        self.train = problems


def make_ctx(model, tokenizer, task, step=0):
    counters = {}

    def rng(stage):
        n = next(counters.setdefault(stage, itertools.count()))
        return torch.Generator().manual_seed(stable_seed(0, step, stage, n))

    def encode(p):
        return torch.tensor(tokenizer.encode(render_prompt(p, tokenizer), add_special_tokens=False))

    return RolloutContext(generator=HFGenerator(HFConfig(), model, tokenizer), tokenizer=tokenizer, task=task,
                          score=lambda groups: None, params=SamplingParams(16), group_size=4, step=step, rng=rng,
                          encode=encode, policy_logprobs=None, model=model, eos_id=tokenizer.eos_token_id)


def fake_probe(answers_of=lambda i: ["1", "1", "2", None]):
    """A stand-in for the model probe: density from a hash of the id, fixed answers."""

    def probe(problems, ctx):
        out = []
        for p in problems:
            i = int(p.id.rsplit("/", 1)[1])
            out.append(Probe(density=(stable_seed("d", p.id) % 1000) / 100, entropy=0.0, answers=answers_of(i),
                             correct=[False] * 4))
        return out

    return probe


def test_neutral_full_budget_random_equals_training_on_all_labels(lab):
    cfg = PivotTraceConfig(strategy="random", label_budget=1.0, pool_size=12)
    sel = SELECTORS.get("pivottrace").build(cfg, BuildEnv(run=None, task=lab, seed=3))
    ref = RandomSelector(ListTask([lab.train[i] for i in range(12)]), seed=3)
    for step in range(7):  # several epochs of a 12-problem pool; no probe (ctx=None would fail one)
        got = sel.next(step, 5, ctx=None)
        assert got == ref.next(step, 5) and all(p.answer == lab.train[int(p.id.rsplit("/", 1)[1])].answer for p in got)
    m = sel.metrics()
    assert m["select/labelled_frac"] == 1.0 and m["select/share_pseudo"] == 0.0 and m["select/share_skip"] == 0.0


def test_triage_routes_and_serves_gold_pseudo_never_skip(lab):
    cfg = PivotTraceConfig(label_budget=0.3, pool_size=20, skip_frac=0.2)
    sel = SELECTORS.get("pivottrace").build(cfg, BuildEnv(run=None, task=lab, seed=0))
    sel.probe = fake_probe()
    served = sel.next(0, 60, ctx=None)
    gold, pseudo, skip = sel.annotated, set(sel.pseudo), sel.skip
    assert (len(gold), len(pseudo), len(skip)) == (6, 10, 4)  # ⌊.3·20⌋, rest − round(.2·20)
    dens = {i: (stable_seed("d", lab.train[i].id) % 1000) / 100 for i in range(20)}
    assert max(dens[i] for i in pseudo) <= min(dens[i] for i in gold)  # confident < informative < chaotic
    assert max(dens[i] for i in gold) <= min(dens[i] for i in skip)
    ids = {int(p.id.rsplit("/", 1)[1]) for p in served}
    assert ids == gold | pseudo  # 60 draws = 3 epochs over 16 trainable problems ... never a skipped one
    for p in served:
        i = int(p.id.rsplit("/", 1)[1])
        assert p.answer == (lab.train[i].answer if i in gold else "1")  # gold label or the majority pseudo-label
    m = sel.metrics()
    assert m["select/share_gold"] == 0.3 and m["select/share_pseudo"] == 0.5 and m["select/share_skip"] == 0.2
    assert m["select/pivot_density_gold"] == pytest.approx(sum(dens[i] for i in gold) / 6)


def test_low_majority_goes_to_annotate_only_while_budget_remains(lab):
    # every pseudo candidate has top share 1/4 < .5; the gold band already took the whole budget (5 of 10)
    cfg = PivotTraceConfig(label_budget=0.5, pool_size=10, skip_frac=0.0, order=("pseudo", "gold", "skip"))
    sel = SELECTORS.get("pivottrace").build(cfg, BuildEnv(run=None, task=lab, seed=0))
    sel.probe = fake_probe(lambda i: ["1", "2", "3", "4"])  # top share .25 < min_majority .5
    sel.next(0, 1, ctx=None)
    assert len(sel.annotated) == 5 and not sel.pseudo and len(sel.skip) == 5  # no budget left → deferred


@settings(max_examples=40, deadline=None)
@given(pool=st.integers(1, 40), budget=st.floats(0.01, 1.0), skip=st.floats(0.0, 0.9),
       order=st.permutations(["pseudo", "gold", "skip"]), rounds=st.integers(1, 4),
       agree=st.booleans())
def test_budget_is_never_exceeded(lab, pool, budget, skip, order, rounds, agree):
    cfg = PivotTraceConfig(label_budget=budget, pool_size=pool, skip_frac=skip, order=tuple(order), refresh_every=1)
    sel = SELECTORS.get("pivottrace").build(cfg, BuildEnv(run=None, task=lab, seed=0))
    sel.probe = fake_probe((lambda i: ["1"] * 4) if agree else (lambda i: ["1", "2", "3", None]))
    for step in range(rounds):
        try:
            sel.next(step, 3, ctx=None)
        except RuntimeError:  # nothing trainable (all skipped) is a loud failure, not a silent one
            assert not sel.annotated and not sel.pseudo
        assert len(sel.annotated) <= int(budget * pool + 1e-9)
        assert not (sel.annotated & sel.skip) and not (sel.annotated & set(sel.pseudo))


def test_probe_determinism_and_state_round_trip(tiny_model, tokenizer, lab):
    cfg = PivotTraceConfig(pool_size=8, probe_samples=2, probe_batch=3, refresh_every=2)

    def run(sel, steps):
        return [[(p.id, p.answer) for p in sel.next(s, 4, make_ctx(tiny_model, tokenizer, lab, s))] for s in steps]

    a, b = (SELECTORS.get("pivottrace").build(cfg, BuildEnv(run=None, task=lab, seed=1)) for _ in range(2))
    first = run(a, range(3))
    assert first == run(b, range(3)) and a.state_dict() == b.state_dict()
    assert a.round == 2 and a.metrics()["select/pool_size"] == 8.0  # re-triaged at step 2
    assert "select/probe_s" in a.metrics()
    c = SELECTORS.get("pivottrace").build(cfg, BuildEnv(run=None, task=lab, seed=1))
    c.load_state_dict(a.state_dict())
    assert run(c, range(3, 6)) == run(a, range(3, 6))
    assert c.state_dict() == a.state_dict()


def test_probe_on_the_tiny_model_returns_densities(tiny_model, tokenizer, lab):
    cfg = PivotTraceConfig(pool_size=4, probe_samples=2, min_shift=0.0, kappa=0.0)
    sel = SELECTORS.get("pivottrace").build(cfg, BuildEnv(run=None, task=lab, seed=0))
    probes = sel.probe(sel.pool, make_ctx(tiny_model, tokenizer, lab))
    assert len(probes) == 4 and all(len(p.answers) == 2 and p.density >= 0 and p.entropy > 0 for p in probes)
    assert any(p.density > 0 for p in probes)  # a random model's attention does shift
    for p in probes:  # the per-trace diagnostics are the density's own inputs
        assert len(p.pivots) == len(p.completions) == 2
        assert all(0 <= k < len(ids) for piv, ids in zip(p.pivots, p.completions) for k in piv)
        assert p.density == pytest.approx(pivot_density([len(v) for v in p.pivots], [len(c) for c in p.completions]))
    gated = dataclasses.replace(cfg, lexical_gate=True, cues=("@@never@@",))
    sel_g = PivotTraceSelector(gated, lab, seed=0)
    assert all(p.density == 0 for p in sel_g.probe(sel_g.pool, make_ctx(tiny_model, tokenizer, lab)))
