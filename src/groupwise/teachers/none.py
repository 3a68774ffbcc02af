"""The ``none`` teacher: no teacher (the default); a loss term that requires one is refused at load."""

from __future__ import annotations

from groupwise.registry import NoConfig
from groupwise.teachers import TEACHERS


@TEACHERS.register("none", config=NoConfig)
def none(cfg: NoConfig, env) -> None:
    return None


