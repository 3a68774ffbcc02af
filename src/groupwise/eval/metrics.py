"""Sample-set metrics.

pass@k uses the unbiased estimator of Chen et al. 2021 (arXiv:2107.03374): with n samples of which c are
correct, pass@k = 1 − C(n−c, k) / C(n, k), computed as a stable product. maj@k is correct iff the most
frequent extracted answer (ties: the earliest-seen answer; missing answers never win) is correct.
"""

from __future__ import annotations

from collections import Counter


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def majority_correct(answers: list[str | None], correct: list[bool]) -> bool:
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    best = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == best)
    return correct[answers.index(winner)]
