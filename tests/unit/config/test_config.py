import dataclasses
import math
import re
import typing

import pytest
import yaml

from groupwise.config import RunConfig, Spec, load, to_dict
from groupwise.registry import ConfigError, NoConfig, Registry


def write(tmp_path, text):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


def test_defaults_resolve():
    cfg = load()
    assert isinstance(cfg, RunConfig)
    assert cfg.advantage.name == "grpo" and cfg.advantage.cfg.eps == 1e-4
    assert [s.name for s in cfg.loss.terms] == ["ppo_clip"]


def test_unknown_key_in_recipe_names_file_line_and_allowed(tmp_path):
    p = write(tmp_path, "trainer:\n  steps: 3\n  stepz: 4\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert f"{p}:3" in msg and "trainer.stepz" in msg and "allowed:" in msg and "steps" in msg
    assert "\n" not in msg


def test_unknown_override_key():
    with pytest.raises(ConfigError, match=r"override 'trainer.stepz=3': trainer.stepz: unknown key; allowed: .*steps"):
        load(None, ["trainer.stepz=3"])


def test_unknown_component_lists_valid_and_closest():
    with pytest.raises(ConfigError,
                       match=r"unknown advantage 'grpp' \(did you mean 'grpo'\?\); valid: .*dr_grpo.*rloo"):
        load(None, ["advantage.name=grpp"])


def test_knob_of_another_component_is_rejected():
    # eps belongs to grpo, not rloo
    with pytest.raises(ConfigError, match=r"advantage.eps: unknown key; allowed: \(none\)"):
        load(None, ["advantage.eps=0.01", "advantage.name=rloo"])


def test_wrong_types():
    with pytest.raises(ConfigError, match="optim.lr: expected a number, got 'fast'"):
        load(None, ["optim.lr=fast"])
    with pytest.raises(ConfigError, match="trainer.steps: expected an integer"):
        load(None, ["trainer.steps=2.5"])
    with pytest.raises(ConfigError, match="loss.reduction: 'mean' is not allowed; allowed: token_mean"):
        load(None, ["loss.reduction=mean"])
    with pytest.raises(ConfigError, match="trainer.progress: expected true or false"):
        load(None, ["trainer.progress=3"])


def test_value_errors_from_post_init_name_the_section(tmp_path):
    p = write(tmp_path, "rollout:\n  group_size: 0\n")
    with pytest.raises(ConfigError, match=r"r.yaml:2: rollout: group_size=0: allowed >= 2"):
        load(p)


def test_scientific_notation_and_int_to_float(tmp_path):
    p = write(tmp_path, "optim:\n  lr: 3e-4\n  grad_clip: 1\n")
    cfg = load(p)
    assert cfg.optim.lr == 3e-4 and cfg.optim.grad_clip == 1.0 and isinstance(cfg.optim.grad_clip, float)


def test_list_index_override_and_weights(tmp_path):
    p = write(tmp_path, "loss:\n  terms:\n    - {name: ppo_clip}\n    - {name: kl, weight: 0.05, estimator: k2}\n")
    cfg = load(p, ["loss.terms.0.clip_high=0.28", "loss.terms.1.weight=0.1"])
    assert cfg.loss.terms[0].cfg.clip_high == 0.28
    assert cfg.loss.terms[1].weight == 0.1 and cfg.loss.terms[1].cfg.estimator == "k2"
    with pytest.raises(ConfigError, match="indexes a list of 2 items"):
        load(p, ["loss.terms.5.weight=1"])


def test_weight_only_for_weighted_kinds():
    with pytest.raises(ConfigError, match="advantage.weight: unknown key"):
        load(None, ["advantage.weight=2"])


def test_partial_component_refines_default(tmp_path):
    p = write(tmp_path, "advantage:\n  eps: 0.001\n")
    assert load(p).advantage.cfg.eps == 0.001


def test_resolved_config_roundtrips(tmp_path):
    cfg = load(None, ["trainer.steps=7", "advantage.name=dr_grpo", "rollout.stop=[\"</answer>\"]"])
    p = tmp_path / "resolved.yaml"
    p.write_text(yaml.safe_dump(to_dict(cfg)))
    again = load(p)
    assert again == cfg


def test_invalid_yaml_reports_line(tmp_path):
    p = write(tmp_path, "trainer:\n  steps: [1, 2\n")
    with pytest.raises(ConfigError, match=r"r.yaml:\d+: invalid YAML"):
        load(p)


def test_registry_did_you_mean_and_duplicates():
    reg = Registry("thing", object, "factory", ("cfg", "env"))
    reg.register("alpha", NoConfig)(lambda cfg, env: 1)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("alpha", NoConfig)(lambda cfg, env: 2)
    with pytest.raises(ConfigError, match=r"unknown thing 'alpah' \(did you mean 'alpha'\?\); valid: alpha"):
        reg.get("alpah")
    assert reg.get("alpha").build(NoConfig()) == 1


def test_registry_checks_the_member_form_and_declared_needs():
    reg = Registry("thing", object, "function", ("batch", "cfg"))
    with pytest.raises(TypeError, match=r"a thing function takes \(batch, cfg\), got \(cfg, env\)"):
        reg.register("bad")(lambda cfg, env: 1)
    with pytest.raises(TypeError, match="unknown needs"):
        reg.register("worse", needs=("oracle",))
    reg.register("ok")(lambda batch, cfg: (batch, cfg))
    bound = reg.get("ok").build(NoConfig())
    assert bound(3) == (3, NoConfig())  # building a function binds its config


# ------------------------------------------------------------------ bad input (issue "Trust what you see")
@pytest.mark.parametrize("override", ["optim.lr=.inf", "optim.lr=.nan", "optim.lr=inf", "optim.lr=-.inf",
                                      "reward.terms.0.weight=.nan", "advantage.eps=.inf",
                                      "optim.betas=[.nan, 0.9]"])
def test_non_finite_float_knobs_fail_at_load(override):
    """Before: `lr: .inf` passed `lr <= 0` and wrote an all-NaN checkpoint; `weight: .nan` crashed later."""
    key = override.partition("=")[0].replace("optim.betas", "optim.betas.0")
    with pytest.raises(ConfigError, match=rf"^override '{re.escape(override)}': {re.escape(key)}: .* is not "
                                          r"allowed; allowed: a finite number$"):
        load("recipes/grpo_lab.yaml", [override])


def test_documented_infinity_still_loads(tmp_path):
    cfg = load(write(tmp_path, "replay: {name: hdr, tau: .inf}\n"))
    assert cfg.replay.cfg.tau == math.inf
    assert load(None, ["replay.name=hdr", "replay.tau=inf"]).replay.cfg.tau == math.inf
    for term in ("opsd", "dash_opsd"):  # the documented "no clip" (before: refused at load)
        assert load(None, [f"loss.terms=[{{name: {term}, token_clip: .inf}}]",
                           "teacher=frozen"]).loss.terms[0].cfg.token_clip == math.inf
    with pytest.raises(ConfigError, match="replay.capacity: expected an integer"):
        load(None, ["replay.name=hdr", "replay.capacity=.inf"])


def test_override_indexes_a_default_list_the_recipe_does_not_spell_out():
    """Before: 'recipes/grpo_lab.yaml:4: loss.terms: expected a list of loss entries' (line 4 is `name:`)."""
    cfg = load("recipes/grpo_lab.yaml", ["loss.terms.0.clip_high=0.28"])
    assert [(s.name, s.weight, s.cfg.clip_low, s.cfg.clip_high) for s in cfg.loss.terms] == [
        ("ppo_clip", 1.0, 0.2, 0.28)]
    with pytest.raises(ConfigError, match=r"^override 'loss.terms.2.clip_high=1': 'loss.terms.2' indexes a "
                                          r"list of 1 items$"):
        load("recipes/grpo_lab.yaml", ["loss.terms.2.clip_high=1"])
    with pytest.raises(ConfigError, match=r"^override 'loss.terms.0.clip_high=-1': loss.terms.0: "):
        load("recipes/grpo_lab.yaml", ["loss.terms.0.clip_high=-1"])


def test_range_error_from_an_override_cites_the_override(tmp_path):
    """Before: 'r.yaml:2: rollout: ...' (the recipe's section line), though the recipe's value was fine."""
    p = write(tmp_path, "seed: 1\nrollout:\n  group_size: 8\n  prompts_per_step: 4\n")
    with pytest.raises(ConfigError, match=r"^override 'rollout.prompts_per_step=0': rollout: "
                                          r"prompts_per_step=0: allowed >= 1$"):
        load(p, ["rollout.prompts_per_step=0"])
    with pytest.raises(ConfigError, match=r"r.yaml:3: rollout: group_size=1: allowed >= 2"):
        load(write(tmp_path, "seed: 1\nrollout:\n  group_size: 1\n  prompts_per_step: 4\n"), ["seed=2"])


@pytest.mark.parametrize("override,message", [
    ("optim.betas=[2,3]", "optim: betas=(2.0, 3.0): allowed two numbers in [0, 1)"),
    ("optim.eps=-1", "optim: eps=-1.0: allowed >= 0"),
    ("optim.weight_decay=-0.1", "optim: weight_decay=-0.1: allowed >= 0"),
    ("optim.grad_clip=-1", "optim: grad_clip=-1.0: allowed >= 0 (0 disables clipping)"),
    ("trainer.threads=-1", "trainer: threads=-1: allowed >= 0"),
    ("model.device=banana", "model: device='banana': allowed a torch device"),
    ("model.device=cuda:x", "model: device='cuda:x': allowed a torch device"),
    ("rollout.group_size=1", "rollout: group_size=1: allowed >= 2"),
    ("eval.k=0", "eval: k=0: allowed >= 1"),
    ("eval.n_problems=-1", "eval: n_problems=-1: allowed >= 1"),
    ("reward.verifier_timeout_s=-1", "reward: verifier_timeout_s=-1.0: allowed >= 0 (0 disables the "
                                     "timeout)"),
    ("name=../escape", "name='../escape': allowed a plain directory name"),
    ("name=a/b", "name='a/b': allowed a plain directory name"),
    ("name=..", "name='..': allowed a plain directory name"),
])
def test_out_of_range_values_are_one_line_errors(override, message):
    """Before: each was accepted silently or crashed later with a traceback (torch's optimizer,
    set_num_threads, model.to, a run written outside out_dir)."""
    with pytest.raises(ConfigError) as e:
        load("recipes/grpo_lab.yaml", [override])
    assert str(e.value).startswith(f"override '{override}': {message}") and "\n" not in str(e.value)


def test_duplicate_yaml_key_names_both_lines(tmp_path):
    """Before: the second `steps` silently won."""
    p = write(tmp_path, "trainer:\n  steps: 3\n  save_every: 1\n  steps: 5\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(p))}:4: trainer.steps: duplicate key \(first at "
                                          rf"{re.escape(str(p))}:2\); allowed: each key once$"):
        load(p)


def test_recipe_that_is_a_directory_or_not_utf8(tmp_path):
    """Before: IsADirectoryError / UnicodeDecodeError tracebacks."""
    with pytest.raises(ConfigError, match=rf"^recipe {re.escape(str(tmp_path))}: not a file"):
        load(tmp_path)
    p = tmp_path / "bad.yaml"
    p.write_bytes(b"trainer:\n  steps: 3 # caf\xff\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(p))}:2: not UTF-8 text \(byte 0xff\)"):
        load(p)
    p.write_bytes(b"\xef\xbb\xbftrainer:\n  steps: 3\n")  # a byte-order mark is fine
    assert load(p).trainer.steps == 3


def test_out_dir_that_is_a_file(tmp_path):
    """Before: NotADirectoryError from mkdir when the run started."""
    f = tmp_path / "notes.txt"
    f.write_text("x")
    with pytest.raises(ConfigError, match=rf"^override 'out_dir={re.escape(str(f))}': out_dir: .* is a file; "
                                          "allowed: a directory"):
        load(None, [f"out_dir={f}"])
    with pytest.raises(ConfigError, match=r"out_dir: .* is a file"):
        load(None, [f"out_dir={f}/runs"])
    assert load(None, [f"out_dir={tmp_path}/new/runs"]).run_dir == tmp_path / "new" / "runs" / "run"


def test_diff_lists_the_dotted_keys_that_differ():
    from groupwise.config import diff

    a = load("recipes/grpo_lab.yaml")
    b = load("recipes/grpo_lab.yaml", ["seed=3", "rollout.group_size=4", "optim.lr=2e-4",
                                       "loss.terms.0.clip_high=0.28"])
    assert diff(a, b) == ["seed", "rollout.group_size", "loss.terms.0.clip_high", "optim.lr"]
    assert diff(a, a) == [] and diff(to_dict(a), b) == diff(a, b)
    c = load("recipes/grpo_lab.yaml", ["advantage.name=rloo", "reward.terms=[correctness, format]"])
    assert diff(a, c) == ["reward.terms", "advantage.name", "advantage.eps", "advantage.ddof"]


def test_a_section_given_a_scalar_names_its_fields_not_its_class(tmp_path):
    """Issue 47 item 4. Before: 'expected a mapping of ImportanceSamplingConfig fields', a Python class name."""
    msg = r"loss.importance_sampling: expected a mapping of \{mode, cap, clip_min\}, got 'token_truncate'; " \
          r"did you mean loss.importance_sampling.mode=token_truncate\?$"
    with pytest.raises(ConfigError, match=msg):
        load(None, ["loss.importance_sampling=token_truncate"])
    with pytest.raises(ConfigError, match=r"r.yaml:2: model.lora: expected a mapping of \{r, alpha, .*\}, got 3$"):
        load(write(tmp_path, "model:\n  lora: 3\n"))
    sections = []  # every dataclass-typed section, nested ones included

    def walk(cls, prefix):
        for name, tp in typing.get_type_hints(cls).items():
            tp = next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), tp)  # X | None
            if dataclasses.is_dataclass(tp) and tp is not Spec:
                sections.append(prefix + name)
                walk(tp, prefix + name + ".")
    walk(RunConfig, "")
    assert {"trainer", "loss.importance_sampling", "model.lora"} <= set(sections)
    for section in sections:
        with pytest.raises(ConfigError, match=rf"{section}: expected a mapping of \{{\w+.*\}}, got 5$") as e:
            load(None, [f"{section}=5"])
        assert "Config" not in str(e.value)


@pytest.mark.parametrize(("path", "warm_start", "steps", "expected"), [
    ("embedded:lab-tiny", "auto", 600, True), ("embedded:lab-tiny", True, 600, True),
    ("embedded:lab-tiny", False, 600, False), ("embedded:lab-tiny", "auto", 0, False),
    ("smollm2-135m-instruct", "auto", 600, False), ("smollm2-135m-instruct", True, 600, True),
    ("some/model-dir", False, 600, False), ("some/model-dir", True, 0, False)])
def test_warm_starts_resolves_auto_as_the_loader_does(path, warm_start, steps, expected):
    """``auto``: embedded models warm-start, pretrained ones only with ``true`` (models/load.py)."""
    from groupwise.config import ModelConfig

    cfg = ModelConfig(path=path, warm_start=warm_start, warm_start_steps=steps)
    assert cfg.warm_starts is expected
