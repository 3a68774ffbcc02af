import itertools

import pytest
import torch
from support import reward_stage

from groupwise.config import load
from groupwise.methods.graphpo.builder import GraphPOConfig, hashed_embedding, pattern_state, policy_embeddings
from groupwise.methods.graphpo.builder import graphpo as graphpo_builder
from groupwise.methods.graphpo.credit import GraphPOCreditConfig, graphpo
from groupwise.registry import BuildEnv, ConfigError
from groupwise.rollout.base import RolloutContext, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.standard.lab import Lab, LabConfig
from groupwise.types import Completion, Problem, ScoredBatch, TokenBatch

PROBLEM = Problem(id="p", prompt="1+1+1", answer="3", meta={"xs": (1, 1, 1), "ops": ("+", "+")})
# A scripted MDP over lab steps: (2, 4) is reached by two different paths, so exact merging has work to do.
SCRIPT = {"": ["<think>1+1=2;", "<think>1+1=3;"], "<think>1+1=2;": ["2+1=3;", "2+1=4;"], "<think>1+1=3;": ["3+1=4;"]}


class Scripted:
    """Reads the path off the prompt (after the problem's newline), samples the next step uniformly from SCRIPT
    (after two steps: the commitment and the answer, then EOS), log-prob −1 per token, cut at the row's cap."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def sync_weights(self, model):
        pass

    def generate(self, requests, params, rng):
        out = []
        for r in requests:
            path = self.tok.decode(r.prompt_ids.tolist(), skip_special_tokens=False).split("\n", 1)[1]
            if path in SCRIPT:
                options = SCRIPT[path]
                step = options[int(torch.randint(len(options), (1,), generator=rng))]
                ids = self.tok.encode(step, add_special_tokens=False)
            else:
                v = path.rsplit("=", 1)[1].rstrip(";")
                ids = self.tok.encode(f"so {v}.</think><answer>{v}</answer>", add_special_tokens=False)
                ids.append(self.tok.eos_token_id)
            cap = r.max_tokens if r.max_tokens is not None else params.max_tokens
            reason = "stop" if len(ids) <= cap else "length"
            ids = torch.tensor(ids[:cap], dtype=torch.long)
            out.append(Completion(ids, -torch.ones(len(ids)), reason))
        return out


@pytest.fixture()
def lab_task():
    return Lab(LabConfig(test_size=4), seed=0)


def context(tokenizer, task, group_size=8, max_tokens=48, step=0):
    scorer = reward_stage(task, ())
    counters: dict = {}

    def rng(stage):
        return torch.Generator().manual_seed(
            stable_seed(0, step, stage, next(counters.setdefault(stage, itertools.count()))))

    return RolloutContext(
        generator=Scripted(tokenizer), tokenizer=tokenizer, task=task, score=lambda gs: scorer(gs, step),
        params=SamplingParams(max_tokens), group_size=group_size, step=step, rng=rng,
        encode=lambda p: torch.tensor(tokenizer.encode(p.prompt + "\n", add_special_tokens=False)),
        policy_logprobs=lambda samples: [], eos_id=tokenizer.eos_token_id)


def build(task, ctx, **kw):
    builder = graphpo_builder(GraphPOConfig(delimiter=";", step_tokens=16, **kw), BuildEnv(run=None, task=task))
    groups = builder([PROBLEM, PROBLEM], ctx)
    ctx.score(groups)
    return builder, groups


def graph_of(group):
    return group.samples[0].meta["graphpo_graph"]


def test_neutral_setting_is_independent_chains(tokenizer, lab_task):
    _, groups = build(lab_task, context(tokenizer, lab_task), equivalence="none")
    for grp in groups:
        g = graph_of(grp)
        assert len(grp.samples) == 8 and all(bool(s.loss_mask.all()) for s in grp.samples)
        assert [g["parent"][s.meta["graphpo"]["nodes"][0]] for s in grp.samples] == [0] * 8  # 8 root children
        kids = [sum(p == j for p in g["parent"]) for j in range(len(g["parent"]))]
        assert kids[0] == 8 and max(kids[1:]) <= 1  # no branching below the root: chains
        assert all(s.text.startswith("<think>1+1=") and s.text.endswith("</answer>") for s in grp.samples)


def test_neutral_chains_train_as_grpo(tokenizer, lab_task):
    from groupwise.standard.grpo import GRPOConfig, grpo

    _, groups = build(lab_task, context(tokenizer, lab_task), equivalence="none")
    adv = grpo(ScoredBatch.from_groups(groups), GRPOConfig())
    assert adv.abs().sum() > 0  # mixed outcomes: not vacuous
    credited = graphpo(TokenBatch.build(groups, torch.zeros_like(adv)), GraphPOCreditConfig())
    assert torch.equal(credited.advantages, TokenBatch.build(groups, adv).advantages)


def test_exact_merging_expands_each_class_once_and_stays_acyclic(tokenizer, lab_task):
    builder, groups = build(lab_task, context(tokenizer, lab_task), equivalence="exact")
    merged = 0
    for grp in groups:
        g = graph_of(grp)
        n = len(g["parent"])
        members: dict[int, list[int]] = {}
        for j in range(n):
            members.setdefault(g["cls"][j], []).append(j)
        for ms in members.values():
            merged += len(ms) - 1
            assert all(g["parent"].count(m) == 0 for m in ms[1:])  # only the representative has children
            keys = {g["key"][m] for m in ms}
            assert len(keys) == 1  # exact: one canonical state per class
        # class-level edges go from shallower to deeper states: a topological order exists (Kahn)
        edges = {(g["cls"][g["parent"][j]], g["cls"][j]) for j in range(1, n)}
        assert all(a != b for a, b in edges)
        indeg = {c: 0 for c in members}
        for _, b in edges:
            indeg[b] += 1
        order, todo = [], [c for c, d in indeg.items() if d == 0]
        while todo:
            c = todo.pop()
            order.append(c)
            for a, b in edges:
                if a == c:
                    indeg[b] -= 1
                    if indeg[b] == 0:
                        todo.append(b)
        assert len(order) == len(members)
        # each sampled token carries loss in exactly one sample
        sampled = sum(g["path_len"][j] - g["path_len"][g["parent"][j]] for j in range(1, n))
        assert sum(int(s.loss_mask.sum()) for s in grp.samples) == sampled
    assert merged > 0  # the script reaches (1, 2) eight times: not vacuous
    m = builder.metrics()
    assert m["rollout/graphpo_merge_frac"] > 0 and m["rollout/graphpo_sampled_tokens"] <= 8 * 48


def test_merged_member_samples_continue_virtually(tokenizer, lab_task):
    _, groups = build(lab_task, context(tokenizer, lab_task), equivalence="exact")
    for grp in groups:
        g = graph_of(grp)
        for s in grp.samples:
            nodes = s.meta["graphpo"]["nodes"]
            physical = [k == 0 or g["parent"][h] == nodes[k - 1] for k, h in enumerate(nodes)]
            for (start, end), phys in zip(s.meta["graphpo"]["spans"], physical):
                if not phys:  # sampled after another prefix: no loss, no generation log-prob
                    assert not s.loss_mask[start:end].any() and torch.isnan(s.rollout_logprobs[start:end]).all()
            assert s.correct == (s.text.endswith("<answer>3</answer>"))


def test_budget_is_a_hard_cap_and_cut_paths_are_not_samples(tokenizer, lab_task):
    ctx = context(tokenizer, lab_task)
    builder, groups = build(lab_task, ctx, equivalence="none", budget_tokens=60)
    assert builder.metrics()["rollout/graphpo_sampled_tokens"] <= 60
    assert builder.metrics()["rollout/graphpo_cut_frac"] > 0
    for grp in groups:
        assert all(s.text.endswith("</answer>") for s in grp.samples)


def test_tree_branch_shares_prefixes(tokenizer, lab_task):
    builder, groups = build(lab_task, context(tokenizer, lab_task), equivalence="none", branch=2)
    g = graph_of(groups[0])
    assert g["parent"].count(0) == 2  # the root splits its 8 slots in two
    assert builder.metrics()["rollout/graphpo_sampled_tokens"] < 8 * 27  # less than 8 chains of 27 tokens


def test_embedding_merges_never_join_an_ancestor(tokenizer, lab_task):
    _, groups = build(lab_task, context(tokenizer, lab_task), equivalence="embedding", embedder="hashed", kappa=0.05)
    for grp in groups:
        g = graph_of(grp)
        for j in range(1, len(g["parent"])):
            a = g["parent"][j]
            while a > 0:
                assert g["cls"][a] != g["cls"][j]
                a = g["parent"][a]


def test_embedders_are_unit_vectors_and_identical_paths_coincide(tiny_model):
    e = hashed_embedding("<think>1+1=2;", 64)
    assert abs(float(e.norm()) - 1.0) < 1e-12 and float(e @ hashed_embedding("<think>1+1=2;", 64)) == pytest.approx(1.0)
    prompt = torch.tensor([5, 6, 7])
    a, b, c = policy_embeddings(tiny_model, [prompt] * 3, [[8, 9], [8, 9], [9, 8]])
    assert float(a @ b) == pytest.approx(1.0, abs=1e-9) and float(a @ c) < 1.0 - 1e-6


def test_load_time_errors():
    for override, match in [("rollout.builder.kappa=0", "kappa=0"), ("rollout.builder.delimiter=''", "delimiter"),
                            ("rollout.builder.branch=-1", "branch=-1"),
                            ("rollout.builder.budget_tokens=10", "budget_tokens=10"),
                            ("rollout.builder.equivalence=fuzzy", "equivalence")]:
        with pytest.raises(ConfigError, match=match) as e:
            load("recipes/graphpo_lab.yaml", [override])
        assert "\n" not in str(e.value)


def test_exact_equivalence_needs_a_state_oracle():
    class NoOracle:
        name = "plain"

    with pytest.raises(ConfigError, match="canonical_state"):
        graphpo_builder(GraphPOConfig(equivalence="exact"), BuildEnv(run=None, task=NoOracle()))
    graphpo_builder(GraphPOConfig(equivalence="embedding"), BuildEnv(run=None, task=NoOracle()))


def test_pattern_state_reads_steps_and_the_last_result():
    totals = r"= (-?\d+)\."
    assert pattern_state(totals, "5 - 2 = 3. 3 - 10 = -7.") == (2, "-7")
    assert pattern_state(totals, "5 - 2 = 3. ") == (1, "3")  # trailing whitespace aside
    assert pattern_state(totals, "5 - 2 = 3. 3 - 1") is None  # mid-step
    assert pattern_state(totals, "") is None
    with pytest.raises(ValueError, match="capture group"):
        GraphPOConfig(state_pattern=r"=\d+\.")


def test_a_state_pattern_merges_as_the_task_oracle_does(tokenizer, lab_task):
    class NoOracle:
        name = "plain"

    graphpo_builder(GraphPOConfig(equivalence="exact", state_pattern=r"=(\d+);"), BuildEnv(run=None, task=NoOracle()))
    _, oracle = build(lab_task, context(tokenizer, lab_task), equivalence="exact")
    _, pattern = build(lab_task, context(tokenizer, lab_task), equivalence="exact", state_pattern=r"=(\d+);")
    for a, b in zip(oracle, pattern):  # the lab's (steps, last result) read from the text: the same graph
        ga, gb = graph_of(a), graph_of(b)
        assert ga["cls"] == gb["cls"] and ga["parent"] == gb["parent"]
        assert [k is None for k in ga["key"]] == [k is None for k in gb["key"]]
        assert [s.text for s in a.samples] == [s.text for s in b.samples]
    assert max(graph_of(g)["cls"].count(c) for g in pattern for c in graph_of(g)["cls"]) > 1  # merges happened


def test_lab_canonical_state(lab_task):
    assert lab_task.canonical_state(PROBLEM, "<think>3+5=8;8-2=6;") == (2, 6)
    assert lab_task.canonical_state(PROBLEM, "<think>3+5=8;8-") is None
    assert lab_task.canonical_state(PROBLEM, "<think>") is None
