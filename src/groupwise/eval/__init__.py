"""Evaluation: Mean@k, unbiased pass@k, maj@k, greedy accuracy, completion lengths, per-difficulty breakdown."""

from groupwise.eval.evaluate import evaluate, evaluate_run
from groupwise.eval.metrics import majority_correct, pass_at_k

__all__ = ["evaluate", "evaluate_run", "majority_correct", "pass_at_k"]
