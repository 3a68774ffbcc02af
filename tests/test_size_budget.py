"""House-style budgets (STYLE.md 4.12): no function in src/ over 60 lines, the training loop file short."""

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "groupwise"


def test_no_function_over_60_lines():
    long = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines: " + "; ".join(long)


def test_trainer_is_short():
    assert len((SRC / "loop" / "trainer.py").read_text().splitlines()) <= 250
