import torch

from groupwise.filter import has_variance
from groupwise.registry import NoConfig
from groupwise.standard.filters import ZeroVarianceConfig, zero_variance
from groupwise.standard.filters import none as no_filter
from groupwise.types import Group, Problem, Sample


def group(rewards, pid="p"):
    z = torch.zeros(1, dtype=torch.long)
    samples = [Sample(z, z, torch.zeros(1), torch.ones(1, dtype=torch.bool), "stop", reward=r) for r in rewards]
    return Group(Problem(pid, "q", "a"), samples)


def test_has_variance():
    assert has_variance(group([0, 1])) and not has_variance(group([1, 1])) and not has_variance(group([1]))


def test_zero_variance_refills_until_target_or_cap():
    calls = []

    def refill(n):
        calls.append(n)
        return [group([0, 1], f"r{len(calls)}-{i}") if i % 2 == 0 else group([0, 0]) for i in range(n)]

    groups = [group([1, 1]), group([0, 1]), group([0, 0]), group([1, 0])]
    kept, m = zero_variance(ZeroVarianceConfig(max_refill_rounds=3), None)(groups, 4, refill)
    # round 1 asks for 2 and gets 1 useful group, round 2 asks for 1 and gets it
    assert calls == [2, 1] and len(kept) == 4 and all(has_variance(g) for g in kept)
    assert m["filter/zero_variance_frac"] == 0.5 and m["filter/refill_rounds"] == 2.0


def test_zero_variance_without_refill_and_cap_reached():
    kept, m = zero_variance(ZeroVarianceConfig(), None)([group([1, 1]), group([0, 1])], 2,
                                                        lambda n: [group([0, 0])] * n)
    assert len(kept) == 1 and m["filter/refill_rounds"] == 0.0
    kept, m = zero_variance(ZeroVarianceConfig(max_refill_rounds=2), None)([group([1, 1])], 2,
                                                                           lambda n: [group([0, 0])] * n)
    assert kept == [] and m["filter/refill_rounds"] == 2.0


def test_none_filter_is_identity():
    groups = [group([1, 1])]
    assert no_filter(NoConfig(), None)(groups, 1, lambda n: [])[0] is groups
