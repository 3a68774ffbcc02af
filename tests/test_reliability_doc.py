"""docs/reliability.md names the test that keeps each promise: every ``file::test`` it names exists (a renamed or
deleted test fails here, so the page cannot point at nothing). A bare ``::test`` refers to the file named last;
a file may be named by its base name when that is unique under tests/."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def resolve(name: str) -> Path:
    if "/" in name:
        return ROOT / name
    found = list((ROOT / "tests").rglob(name))
    assert len(found) == 1, f"{name}: {len(found)} files under tests/"
    return found[0]


def test_every_test_the_reliability_page_names_exists():
    text = (ROOT / "docs" / "reliability.md").read_text()
    text = text[text.index("\n## "):]  # the tables (the intro shows the notation)
    checked, last = 0, None
    for m in re.finditer(r"([\w/]*test_\w+\.py)|::(\w+)", text):
        if m.group(1):
            last = resolve(m.group(1))
            assert last.exists(), m.group(1)
            continue
        assert last is not None, f"::{m.group(2)} before any file"
        assert re.search(rf"^def {m.group(2)}\(", last.read_text(), re.M), f"{last}::{m.group(2)} does not exist"
        checked += 1
    assert checked >= 30, "the page names its tests"
