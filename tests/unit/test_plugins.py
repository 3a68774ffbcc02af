import sys
import textwrap
from pathlib import Path

import pytest
import torch

from groupwise import cli, plugins
from groupwise.advantages import ADVANTAGES
from groupwise.catalog import registry
from groupwise.config import load
from groupwise.credit import CREDIT
from groupwise.registry import ConfigError
from groupwise.rewards import REWARDS
from groupwise.rollout import BUILDERS
from groupwise.types import Problem, ScoredBatch

ROOT = Path(__file__).parents[2]


@pytest.fixture()
def clean(monkeypatch):
    """Registries as they were: plugins registered in a test do not leak into others."""
    for reg in (ADVANTAGES, REWARDS, BUILDERS, CREDIT):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    monkeypatch.setattr(plugins, "_loaded_entry_points", False)
    for name in [m for m in sys.modules if m.startswith("groupwise_plugin_") or m.startswith("gw_test_plugin")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_recipe_plugin_registers_like_a_builtin_and_is_listed(clean, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("plugins: [examples/my_components.py]\nadvantage: median_baseline\n")
    cfg = load(recipe)
    assert cfg.advantage.name == "median_baseline" and cfg.plugins == (str(ROOT / "examples/my_components.py"),)
    entry = ADVANTAGES.get("median_baseline")
    # rewards 1, 0, 1, .5 (sorted 0, .5, 1, 1: the lower middle is .5) → 1 − .5, 0 − .5, 1 − .5, .5 − .5;
    # the padded second group [3, 1, pad, pad] has median 1 → 2, 0, and 0 on padding
    r = torch.tensor([[1.0, 0.0, 1.0, 0.5], [3.0, 1.0, 7.0, 7.0]], dtype=torch.float64)
    m = torch.tensor([[True] * 4, [True, True, False, False]])
    adv = entry.build(entry.config())(ScoredBatch([], r, m, r, m))
    assert torch.equal(adv, torch.tensor([[0.5, -0.5, 0.5, 0.0], [2.0, 0.0, 0.0, 0.0]], dtype=torch.float64))
    load(recipe)  # a second load reuses the imported module: nothing registers twice
    cli.main(["list", "advantage", "--plugin", "examples/my_components.py"])
    out = capsys.readouterr().out
    assert "median_baseline (groupwise_plugin_my_components_" in out and "grpo," in out


def test_a_module_plugin_and_load_errors(clean, tmp_path, monkeypatch):
    pkg = tmp_path / "gw_test_plugin_mod.py"
    pkg.write_text(textwrap.dedent('''
        from groupwise.registry import NoConfig
        from groupwise.rewards import REWARDS
        from groupwise.rewards import per_sample

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
        from groupwise.rewards import per_sample

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


BAD = textwrap.dedent('''
    import dataclasses, sys
    import torch
    from groupwise.advantages import ADVANTAGES
    from groupwise.credit import CREDIT
    from groupwise.rollout import BUILDERS

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Mode:
        mode: str = "shape"

    @ADVANTAGES.register("bad_adv", config=Mode)
    def bad_adv(batch, cfg):
        if cfg.mode == "raise":
            raise ValueError("boom\\nsecond line")
        if cfg.mode == "exit":
            sys.exit(3)
        return batch.rewards[:, 0][:3]

    @BUILDERS.register("bad_builder", config=Mode)
    def bad_builder(cfg, env):
        if cfg.mode == "build":
            raise RuntimeError("cannot build")
        def build(problems, ctx):
            if cfg.mode == "exit":
                sys.exit(4)
            if cfg.mode == "tuple":
                return tuple(problems)
            if cfg.mode == "core":
                from groupwise.types import ScoredBatch
                return ScoredBatch.from_groups(problems)
            return {}["missing"]
        return build

    @CREDIT.register("bad_credit", config=Mode)
    def bad_credit(batch, cfg):
        return dataclasses.replace(batch, advantages=batch.advantages[:, :1])
''')


def line_of(code: str) -> int:
    return next(i for i, x in enumerate(BAD.splitlines(), 1) if code in x)


def _bad_plugin(tmp_path):
    path = tmp_path / "bad_components.py"
    path.write_text(BAD)
    plugins.import_ref(str(path))
    return str(path.resolve())


def test_a_plugin_that_raises_exits_or_breaks_its_contract_is_one_line_naming_it(clean, tmp_path):
    path = _bad_plugin(tmp_path)
    r = torch.zeros(4, 8, dtype=torch.float64)
    batch = ScoredBatch([], r, r.bool(), r, torch.ones(4, 8, dtype=torch.bool))
    adv = ADVANTAGES.get("bad_adv")
    name = f"advantage plug-in 'bad_adv' ({path})"
    cases = {"shape": f"{name}: returned shape (3,) (torch.float64) for 4 groups x 8 samples; the contract "
                      "is a (groups, group_size) float tensor",
             "raise": f"{name}: raised ValueError: boom (line {line_of('boom')})",
             "exit": f"{name}: called sys.exit(3); a plug-in returns its result (or raises), never exits"}
    for mode, line in cases.items():
        with pytest.raises(plugins.PluginError) as e:
            adv.build(adv.config(mode=mode))(batch)
        assert str(e.value) == line and isinstance(e.value, ConfigError)  # ConfigError: one line, exit code 2
    builder, problems = BUILDERS.get("bad_builder"), [Problem(id="p", prompt="q", answer="a")]
    first = r"^group builder plug-in 'bad_builder' \(.*bad_components.py\): raised KeyError: 'missing'"
    with pytest.raises(plugins.PluginError, match=rf"{first} \(line {line_of('missing')}\)$"):
        builder.build(builder.config(), None)(problems, None)
    with pytest.raises(plugins.PluginError, match=r"called sys.exit\(4\)"):
        builder.build(builder.config(mode="exit"), None)(problems, None)
    with pytest.raises(plugins.PluginError, match="returned a tuple of Problem; the contract is a list"):
        builder.build(builder.config(mode="tuple"), None)(problems, None)
    with pytest.raises(plugins.PluginError, match=rf"raised RuntimeError while being built: cannot build "
                                                  rf"\(line {line_of('cannot build')}\)"):
        builder.build(builder.config(mode="build"), None)


def test_a_plugin_credits_shape_is_checked_and_core_errors_pass_through_unchanged(clean, tmp_path):
    path = _bad_plugin(tmp_path)
    from groupwise.types import TokenBatch

    rows = torch.zeros(2, dtype=torch.long)
    tokens = TokenBatch([], [], rows, rows.bool(), torch.zeros(2, 3, dtype=torch.long),
                        torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, 3), torch.ones(2, 3))
    credit = CREDIT.get("bad_credit")
    with pytest.raises(plugins.PluginError) as e:
        credit.build(credit.config())(tokens)
    assert str(e.value) == (f"credit plug-in 'bad_credit' ({path}): returned advantages (2, 1), loss_weights "
                            "(2, 3) for 2 rows x 3 tokens; the contract is a TokenBatch whose advantages and "
                            "loss_weights keep the (rows, tokens) shape")
    builder = BUILDERS.get("bad_builder")  # groupwise's own failure, reached through the plug-in: not its own
    with pytest.raises(AttributeError, match="NoneType"):
        builder.build(builder.config(mode="core"), None)([None], None)


def test_a_wrong_shaped_plugin_advantage_stops_train_in_one_line(clean, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    path = _bad_plugin(tmp_path)
    code = cli.main(["train", str(ROOT / "recipes/fake_generator_lab.yaml"), "trainer.steps=1",
                     f"plugins=[{path}]", "advantage=bad_adv", f"out_dir={tmp_path}", "eval.before=false",
                     "eval.after=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: advantage plug-in 'bad_adv' ({path}): returned shape (3,) "
                                 "(torch.float64) for 4 groups x 4 samples; the contract is a (groups, "
                                 "group_size) float tensor"]


MORE = textwrap.dedent('''
    import torch
    from groupwise.filter import FILTERS
    from groupwise.losses import LOSSES
    from groupwise.replay import BUFFERS
    from groupwise.rollout import GENERATORS
    from groupwise.select import SELECTORS
    from groupwise.teachers import TEACHERS
    from groupwise.types import LossTerms

    @SELECTORS.register("short_selector")
    def short_selector(cfg, env):
        class S:
            def next(self, step, n, ctx=None):
                return env[:n - 1]
            def state_dict(self):
                return {}
        return S()

    @BUFFERS.register("dict_buffer")
    def dict_buffer(cfg, env):
        class B:
            def sample(self, step, ctx):
                return {}
            def add(self, groups, adv, step):
                raise ValueError("full")
        return B()

    @FILTERS.register("list_filter")
    def list_filter(cfg, env):
        return lambda groups, target, refill: groups

    @TEACHERS.register("none_teacher")
    def none_teacher(cfg, env):
        class T:
            def score(self, samples, problems, want):
                return None
        return T()

    @GENERATORS.register("short_generator")
    def short_generator(cfg, env):
        class G:
            def generate(self, requests, params, rng):
                return []
        return G()

    @LOSSES.register("row_loss")
    def row_loss(inp, cfg):
        return LossTerms(inp.logprobs.sum(-1))
''')


def test_every_kind_with_user_code_in_the_hot_path_checks_a_plugins_output(clean, tmp_path, monkeypatch):
    """Issue 31: selectors, buffers, filters, teachers, generators and losses had no contract: a plug-in's wrong
    output surfaced as a traceback far from it. Each now stops in one line naming the plug-in and the method."""
    from groupwise.filter import FILTERS
    from groupwise.losses import LOSSES
    from groupwise.replay import BUFFERS
    from groupwise.rollout import GENERATORS
    from groupwise.select import SELECTORS
    from groupwise.teachers import TEACHERS
    from groupwise.types import LossInputs

    for reg in (FILTERS, LOSSES, BUFFERS, GENERATORS, SELECTORS, TEACHERS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    path = tmp_path / "more_components.py"
    path.write_text(MORE)
    plugins.import_ref(str(path))
    problems = [Problem(id=str(i), prompt="q", answer="a") for i in range(3)]

    def built(reg, name, env=None):
        entry = reg.get(name)
        return entry.build(entry.config(), env)

    cases = [
        (lambda: built(SELECTORS, "short_selector", problems).next(0, 3), "selector plug-in 'short_selector'",
         "next() returned a list of Problem for n=3; the contract is a list of n Problems"),
        (lambda: built(BUFFERS, "dict_buffer").sample(0, None), "replay buffer plug-in 'dict_buffer'",
         "sample() returned a dict; the contract is a list of Replayed"),
        (lambda: built(BUFFERS, "dict_buffer").add([], None, 0), "replay buffer plug-in 'dict_buffer'",
         "raised ValueError in add(): full"),
        (lambda: built(FILTERS, "list_filter")([], 4, None), "filter plug-in 'list_filter'",
         "returned a list; the contract is (a list of Groups, a dict of metrics)"),
        (lambda: built(TEACHERS, "none_teacher").score([1, 2], problems, None), "teacher plug-in 'none_teacher'",
         "score() returned a NoneType for 2 samples; the contract is a TeacherOutput"),
        (lambda: built(GENERATORS, "short_generator").generate([1, 2], None, None),
         "generator plug-in 'short_generator'",
         "generate() returned a list for 2 requests; the contract is a list of one Completion each"),
    ]
    t = torch.zeros(2, 5)
    inp = LossInputs(logprobs=t, old_logprobs=t, advantages=t, completion_mask=t.bool(), rollout_logprobs=t)
    cases.append((lambda: built(LOSSES, "row_loss")(inp), "loss plug-in 'row_loss'",
                  "returned LossTerms with per_token of shape (2,) for 2 rows x 5 tokens; the contract is LossTerms "
                  "with a [B, T] per_token"))
    for call, who, why in cases:
        with pytest.raises(plugins.PluginError) as e:
            call()
        assert str(e.value).startswith(f"{who} ({path.resolve()}): {why}"), str(e.value)
        assert "\n" not in str(e.value)
    assert built(SELECTORS, "short_selector", problems).state_dict() == {}  # other attributes: the plug-in's own
