import math

import pytest
import torch
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.graphpo.credit import GraphPOCreditConfig, edge_advantages, graphpo, standardise, values
from groupwise.registry import ConfigError
from groupwise.types import Group, Problem, Sample, TokenBatch

EPS = 1e-4


def graph(parent, cls, terminal, path_len):
    n = len(parent)
    return {"parent": parent, "cls": cls, "terminal": terminal, "path_len": path_len, "parent_cos": [math.nan] * n,
            "key": [None] * n}


def samples_for(g, paths, rewards):
    """Samples whose completion is the concatenation of their path's edges (edge length = path_len difference);
    the physical prefix (up to the first node whose parent is not the previous head) owns its edges once."""
    owned, out = set(), []
    for path, r in zip(paths, rewards):
        spans, mask, pos = [], [], 0
        physical = True
        for k, h in enumerate(path):
            physical = physical and (k == 0 and g["parent"][h] in (0, -1) or k > 0 and g["parent"][h] == path[k - 1])
            length = g["path_len"][h] - g["path_len"][g["parent"][h]]
            spans.append([pos, pos + length])
            mask += [physical and h not in owned] * length
            if physical:
                owned.add(h)
            pos += length
        s = Sample(prompt_ids=torch.tensor([1]), completion_ids=torch.ones(pos, dtype=torch.long),
                   rollout_logprobs=torch.zeros(pos), loss_mask=torch.tensor(mask), finish_reason="stop", reward=r,
                   scored=True, meta={"graphpo": {"nodes": path, "spans": spans, "terminal": path[-1]},
                                      "graphpo_graph": g})
        out.append(s)
    return out


def token_batch(sample_lists):
    groups = [Group(problem=Problem(f"p{i}", "q", "0"), samples=s) for i, s in enumerate(sample_lists)]
    g = max(len(s) for s in sample_lists)
    return TokenBatch.build(groups, torch.zeros(len(groups), g, dtype=torch.float64))


# The pinned graph. Root 0 has three children: 1 and 2 reach the same state (class 1, representative 1), 3 another.
# Node 1 expands to terminals 4 (R = 1) and 5 (R = 0); 3 to terminal 6 (R = 0); member 2's sample continues
# virtually through 4. Edge tokens: node 1: 3, node 2: 5, node 3: 4, terminals: 2 each.
PINNED = graph(parent=[-1, 0, 0, 0, 1, 1, 3], cls=[0, 1, 1, 3, 4, 5, 6],
               terminal=[False, False, False, False, True, True, True], path_len=[0, 3, 5, 4, 5, 5, 6])
PATHS = [[1, 4], [1, 5], [3, 6], [2, 4]]
REWARDS = [1.0, 0.0, 0.0, 1.0]


def test_pinned_values_and_edge_advantages():
    reward = {4: 1.0, 5: 0.0, 6: 0.0}
    v_pool, v_cls = values(PINNED, PATHS, reward, 0.7)
    # V(C): root {4,5,6} -> 1/3; class 1 reaches {4,5} -> 1/2; class 3 {6} -> 0. V_own: node 1 {4,5} -> 1/2,
    # node 2 {4} -> 1 (its one continuation). V_pool(2) = 1/2 + 0.3·(1 − 1/2) = 0.65.
    assert_close(v_cls, [1 / 3, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0], rtol=0, atol=1e-15)
    assert_close(v_pool, [1 / 3, 0.5, 0.65, 0.0, 1.0, 0.0, 0.0], rtol=0, atol=1e-15)
    a = edge_advantages(PINNED, PATHS, reward, GraphPOCreditConfig(w=0.7, mu=1.0))
    # root group x = (0.5, 0.65, 0): mean 0.38333…, std (ddof 1) = sqrt((0.11667² + 0.26667² + 0.38333²)/2)
    x = [0.5, 0.65, 0.0]
    m = sum(x) / 3
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / 2)
    corr = {1: (0.5 - m) / (sd + EPS), 2: (0.65 - m) / (sd + EPS), 3: (0.0 - m) / (sd + EPS)}
    # class 1's outgoing edges: V_pool (1, 0): ±0.5 / (sqrt(0.5) + eps); class 3's single edge inherits A_corr(3)
    corr.update({4: 0.5 / (math.sqrt(0.5) + EPS), 5: -0.5 / (math.sqrt(0.5) + EPS), 6: corr[3]})
    # efficiency: class 1 has members 1 (3 tokens) and 2 (5 tokens), V = 1/2 > 0: −(ℓ − 4) / (sqrt(2) + eps)
    eff = {1: 1 / (math.sqrt(2) + EPS), 2: -1 / (math.sqrt(2) + EPS)}
    expected = {j: corr[j] + eff.get(j, 0.0) for j in range(1, 7)}
    assert a.keys() == expected.keys()
    assert_close([a[j] for j in range(1, 7)], [expected[j] for j in range(1, 7)], rtol=0, atol=1e-12)
    assert_close(a[1], 0.342700 + 0.707056, rtol=0, atol=1e-5)  # the numbers, for a reader


def test_tokens_get_their_edge_advantage_and_shared_copies_none():
    batch = graphpo(token_batch([samples_for(PINNED, PATHS, REWARDS)]), GraphPOCreditConfig())
    a = edge_advantages(PINNED, PATHS, {4: 1.0, 5: 0.0, 6: 0.0}, GraphPOCreditConfig())
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    assert batch.advantages[0, :5].tolist() == [f32(a[1])] * 3 + [f32(a[4])] * 2
    assert batch.advantages[1, :5].tolist() == [0.0] * 3 + [f32(a[5])] * 2  # node 1 is owned by row 0
    assert batch.advantages[2, :6].tolist() == [f32(a[3])] * 4 + [f32(a[6])] * 2
    assert batch.advantages[3, :7].tolist() == [f32(a[2])] * 5 + [0.0] * 2  # the virtual continuation: no loss
    assert int(batch.completion_mask.sum()) == 3 + 5 + 4 + 2 + 2 + 2  # every edge's tokens exactly once


def test_w0_is_the_tree_estimate():
    v_pool, _ = values(PINNED, PATHS, {4: 1.0, 5: 0.0, 6: 0.0}, 0.0)
    assert v_pool[2] == 1.0 and v_pool[1] == 0.5  # V_own only: member 2's own continuation


def chains(rewards):
    """G independent chains of two edges (3 + 2 tokens), the neutral setting's graph."""
    g_ = len(rewards)
    parent, cls, term, plen = [-1], [0], [False], [0]
    for i in range(g_):
        parent += [0, 1 + 2 * i]
        cls += [1 + 2 * i, 2 + 2 * i]
        term += [False, True]
        plen += [3, 5]
    return graph(parent, cls, term, plen), [[1 + 2 * i, 2 + 2 * i] for i in range(g_)]


def test_neutral_chains_give_the_grpo_sequence_advantage_exactly():
    from groupwise.standard.grpo import GRPOConfig, grpo
    from groupwise.types import ScoredBatch

    lists, groups = [], []
    for rewards in ([1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.25, 1.0, 0.0, 0.5]):
        g, paths = chains(rewards)
        lists.append(samples_for(g, paths, rewards))
        groups.append(Group(problem=Problem(f"p{len(groups)}", "q", "0"), samples=lists[-1]))
    adv = grpo(ScoredBatch.from_groups(groups), GRPOConfig())
    plain = TokenBatch.build(groups, adv)
    credited = graphpo(TokenBatch.build(groups, torch.zeros_like(adv)), GraphPOCreditConfig(w=0.7, mu=1.0))
    assert torch.equal(credited.advantages, plain.advantages)
    # [1, 0, 0, 1]: mean 0.5, std (ddof 1) sqrt(1/3): ±0.5 / (0.57735 + 1e-4) = ±0.86588 on every token
    assert_close(credited.advantages[0, :5], torch.full((5,), 0.5 / (math.sqrt(1 / 3) + EPS)), rtol=0, atol=1e-6)


def test_singleton_root_group_and_constant_groups_are_zero():
    g, paths = chains([1.0])
    batch = graphpo(token_batch([samples_for(g, paths, [1.0])]), GraphPOCreditConfig())
    assert batch.advantages.abs().sum() == 0
    assert standardise([0.1] * 6, EPS) == [0.0] * 6


def test_correctness_and_efficiency_groups_sum_to_zero():
    reward = {4: 1.0, 5: 0.0, 6: 0.0}
    corr = edge_advantages(PINNED, PATHS, reward, GraphPOCreditConfig(mu=0.0))
    assert abs(corr[1] + corr[2] + corr[3]) < 1e-12 and abs(corr[4] + corr[5]) < 1e-12
    both = edge_advantages(PINNED, PATHS, reward, GraphPOCreditConfig(mu=1.0))
    assert abs((both[1] - corr[1]) + (both[2] - corr[2])) < 1e-12


def test_values_in_reward_range_and_all_correct_class_is_one():
    reward = {4: 1.0, 5: 1.0, 6: 0.0}
    v_pool, v_cls = values(PINNED, PATHS, reward, 0.7)
    assert v_cls[1] == v_cls[2] == 1.0
    assert all(0.0 <= v <= 1.0 for v in v_pool + v_cls)


def test_no_efficiency_advantage_for_a_dead_end_class():
    reward = {4: 0.0, 5: 0.0, 6: 0.0}
    a = edge_advantages(PINNED, PATHS, reward, GraphPOCreditConfig(mu=1.0))
    assert a == dict.fromkeys(range(1, 7), 0.0)  # V = 0 everywhere: no correctness spread, no efficiency term


def synthetic(gen, w):
    """Root → 4 steps, each to state A (p 0.5) or B; a state's first visitor expands 4 terminals with R ~ Bern(0.8)
    (A) or Bern(0.2) (B); the other visitors merge and continue through one of them at random. Returns the mean
    advantage of the root edges into A (None when none went there)."""
    parent, cls, term, plen, paths, reward = [-1], [0], [False], [0], [], {}
    first: dict[str, int] = {}
    visitors = []
    for _ in range(4):
        state = "A" if torch.rand(1, generator=gen) < 0.5 else "B"
        j = len(parent)
        parent.append(0), term.append(False), plen.append(3)
        cls.append(cls[first[state]] if state in first else j)
        first.setdefault(state, j)
        visitors.append((j, state))
    kids: dict[str, list[int]] = {}
    for state, rep in first.items():
        for _ in range(4):
            t = len(parent)
            parent.append(rep), cls.append(t), term.append(True), plen.append(5)
            reward[t] = float(torch.rand(1, generator=gen) < (0.8 if state == "A" else 0.2))
            kids.setdefault(state, []).append(t)
            paths.append([rep, t])
    for j, state in visitors:
        if j != first[state]:
            paths.append([j, kids[state][int(torch.randint(4, (1,), generator=gen))]])
    a = edge_advantages(graph(parent, cls, term, plen), paths, reward, GraphPOCreditConfig(w=w, mu=0.0))
    into_a = [a[j] for j, s in visitors if s == "A"]
    return sum(into_a) / len(into_a) if into_a else None


def test_pooling_lowers_the_variance_of_edge_advantages():
    var = {}
    for w in (0.0, 0.7):
        gen = torch.Generator().manual_seed(0)  # the same graphs for both w
        xs = [x for x in (synthetic(gen, w) for _ in range(400)) if x is not None]
        var[w] = torch.tensor(xs, dtype=torch.float64).var().item()
    assert var[0.7] < var[0.0]


def test_load_time_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"credit.0: credit 'graphpo' requires 'rollout_graph'.*"
                                          r"allowed: add group builder 'graphpo'") as e:
        load("recipes/grpo_lab.yaml", ["credit=[{name: graphpo}]"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="w=1.5"):
        load("recipes/graphpo_lab.yaml", ["credit=[{name: graphpo, w: 1.5}]"])
    with pytest.raises(ConfigError, match=r"requires 'endpoint_similarity'.*group builder 'graphpo' "
                                          r"\(``rollout_graph``.*with "
                                          r"``equivalence: embedding`` also ``endpoint_similarity``\)$"):
        load("recipes/graphpo_lab.yaml", ["credit=[{name: graphpo, gamma_s: 1.0}]"])
