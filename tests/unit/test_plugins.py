import sys
import textwrap
from pathlib import Path

import pytest
import torch

from groupwise import cli, plugins
from groupwise.advantages import ADVANTAGES
from groupwise.catalog import registry
from groupwise.config import load
from groupwise.registry import ConfigError
from groupwise.rewards import REWARDS
from groupwise.types import ScoredBatch

ROOT = Path(__file__).parents[2]


@pytest.fixture()
def clean(monkeypatch):
    """Registries as they were: plugins registered in a test do not leak into others."""
    for reg in (ADVANTAGES, REWARDS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    monkeypatch.setattr(plugins, "_loaded_entry_points", False)
    for name in [m for m in sys.modules if m.startswith("groupwise_plugin_") or m.startswith("gw_test_plugin")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_recipe_plugin_registers_like_a_builtin_and_is_listed(clean, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("plugins: [examples/my_components.py]\nadvantage: maxrl\n")
    cfg = load(recipe)
    assert cfg.advantage.name == "maxrl" and cfg.plugins == (str(ROOT / "examples/my_components.py"),)
    entry = ADVANTAGES.get("maxrl")
    # MaxRL, one success in four: mean 0.25 → (1 − .25)/.25 = 3 and (0 − .25)/.25 = −1
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    m = torch.ones_like(r, dtype=torch.bool)
    adv = entry.build(entry.config())(ScoredBatch([], r, m, r, m))
    assert torch.equal(adv, torch.tensor([[3.0, -1.0, -1.0, -1.0]], dtype=torch.float64))
    load(recipe)  # a second load reuses the imported module: nothing registers twice
    cli.main(["list", "advantage", "--plugin", "examples/my_components.py"])
    out = capsys.readouterr().out
    assert "maxrl (groupwise_plugin_my_components_" in out and "grpo," in out


def test_a_module_plugin_and_load_errors(clean, tmp_path, monkeypatch):
    pkg = tmp_path / "gw_test_plugin_mod.py"
    pkg.write_text(textwrap.dedent('''
        from groupwise.registry import NoConfig
        from groupwise.rewards import REWARDS
        from groupwise.rewards.basic import per_sample

        @REWARDS.register("always_half", config=NoConfig)
        def always_half(cfg, env):
            return per_sample(lambda s, p: 0.5)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load(None, ["plugins=[gw_test_plugin_mod]", "reward.terms=[always_half]"])
    assert cfg.reward.terms[0].name == "always_half" and cfg.plugins == ("gw_test_plugin_mod",)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nplugins:\n  - missing_file.py\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: plugins.0: plugin 'missing_file.py': no such file"):
        load(bad)
    with pytest.raises(ConfigError, match="not a file and not an importable module"):
        load(None, ["plugins=[no_such_module_anywhere]"])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('plugin bug')\n")
    with pytest.raises(ConfigError, match="importing it failed: RuntimeError: plugin bug"):
        load(None, [f"plugins=[{broken}]"])


def test_an_installed_entry_point_registers_on_first_use(clean, tmp_path, monkeypatch):
    (tmp_path / "gw_test_plugin_ep.py").write_text(textwrap.dedent('''
        from groupwise.registry import NoConfig
        from groupwise.rewards import REWARDS
        from groupwise.rewards.basic import per_sample

        @REWARDS.register("from_entry_point", config=NoConfig)
        def from_entry_point(cfg, env):
            return per_sample(lambda s, p: 1.0)
    '''))
    dist = tmp_path / "gw_test_plugin_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gw-test-plugin-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[groupwise.plugins]\nmine = gw_test_plugin_ep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "from_entry_point" not in REWARDS
    assert "from_entry_point" in registry("reward").names()  # the catalogue imports the group's entry points
    assert load(None, ["reward.terms=[from_entry_point]"]).reward.terms[0].name == "from_entry_point"
