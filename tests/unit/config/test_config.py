import pytest
import yaml

from groupwise.config import RunConfig, load, to_dict
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
    with pytest.raises(ConfigError, match=r"unknown advantage 'grpp' \(did you mean 'grpo'\?\); valid: .*dr_grpo.*rloo"):
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
    with pytest.raises(ConfigError, match=r"r.yaml:2: rollout: prompts_per_step, group_size"):
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
