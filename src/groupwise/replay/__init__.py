"""Replay buffers: stored scored groups mixed into the fresh batch.

Registry signature: ``factory(cfg) -> Buffer``. A Buffer implements

  ``sample(step, ctx) -> list[Group]``  groups to replay this step (never ones added at ``step``); each
      carries its stored advantages in ``Sample.advantage`` and behaviour log-probs in
      ``Sample.old_logprobs``; ``ctx.policy_logprobs`` gives one teacher-forced pass of the current policy
  ``add(groups, step)``                 offer the step's fresh groups (after the update)
  ``metrics() -> dict``, ``state_dict()``, ``load_state_dict(state)`` (checkpointed)
"""

from __future__ import annotations

from groupwise.registry import NoConfig, Registry

BUFFERS = Registry("replay buffer", "factory(cfg) -> Buffer")


class NoReplay:
    def sample(self, step, ctx):
        return []

    def add(self, groups, step) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@BUFFERS.register("none", config=NoConfig)
def none(cfg: NoConfig) -> NoReplay:
    return NoReplay()


from groupwise.replay import basic, hdr  # noqa: E402,F401  (registration)
