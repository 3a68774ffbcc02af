"""Run configuration: frozen dataclasses, YAML recipes, dotted CLI overrides, strict validation.

A recipe lists only what differs from the defaults below. A component slot is written as
``{name: <registered name>, <that component's knobs>}`` (or just the name); weighted slots (reward and loss
terms) also take ``weight``. Overrides use dotted paths: ``trainer.steps=3``, ``advantage.name=rloo``,
``loss.terms.0.clip_high=0.28``. Every error is one line naming the file:line or override, the key path,
and what is allowed (a range error raised by an override cites the override). Float knobs must be finite
(``.nan`` / ``.inf`` fail at load) except the knobs whose field says ``infinite`` (``INFINITE``); duplicate YAML keys
fail naming both lines. An override may index a default list the recipe does not spell out
(``loss.terms.0.clip_high=0.28``). Component configs may define ``check(run)`` for cross-section rules.
``diff(a, b)`` lists the dotted keys where two resolved configs differ (e.g. a resume with new overrides).
``method: <name>`` (or a list) names every member of a method that spans stages at once (``methods.py``: a bundle,
expanded into the members' own keys before validation).

The package is the schema and its loader only: a ``Spec`` names a component and holds its validated config;
``loop/setup.py`` (``bind``: the entry's ``Entry.build``) turns it into the bound object. The registries are
consulted here only to find each component's config class and declared abilities. ``plugins:`` (files or
modules) are imported before anything else is validated, so their components are known by name. By concern:
``schema.py`` (the dataclasses), ``parse.py`` (values to typed objects, one-line errors), ``load.py`` (YAML,
overrides, merging, ``to_dict`` / ``diff``), ``methods.py`` (method bundles), ``check.py`` (rules across
sections).
"""

from groupwise.config.check import check, loss_needs, providers, slots
from groupwise.config.load import diff, load, merge, to_dict
from groupwise.config.parse import INFINITE, Spec
from groupwise.config.schema import (
    EvalConfig,
    ImportanceSamplingConfig,
    LoraConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    ToolsConfig,
    TrainerConfig,
)
from groupwise.registry import ConfigError

__all__ = ["INFINITE", "ConfigError", "EvalConfig", "ImportanceSamplingConfig", "LoraConfig", "LossConfig",
           "ModelConfig", "OptimConfig", "RewardConfig", "RolloutConfig", "RunConfig", "Spec", "ToolsConfig",
           "TrainerConfig", "check", "diff", "load", "loss_needs", "merge", "providers", "slots", "to_dict"]
