"""An OpenEnv environment for the ``openenv`` task's tests, served by ``create_app``: by seed, a game that ends
after two steps (seeds < 100), and bad behaviour: a step that raises (900), hangs (901), returns a reward that is not a
number (902), a reset that is not deterministic (903)."""

import random
import time
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app


class Say(Action):
    message: str


class Heard(Observation):
    text: str = ""
    reward: Any = None  # any JSON, so that a malformed reward reaches the client


class Game(Environment[Say, Heard, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.seed, self.steps, self._state = 0, 0, State()

    def reset(self, seed=None, episode_id=None, **kwargs) -> Heard:
        self.seed, self.steps = seed or 0, 0
        if self.seed == 903:
            return Heard(text=f"fresh {random.random()}")
        return Heard(text=f"say {self.seed}")

    def step(self, action: Say, timeout_s=None, **kwargs) -> Heard:
        self.steps += 1
        if self.seed == 900:
            raise RuntimeError("simulator crashed")
        if self.seed == 901:
            time.sleep(3600)
        if self.seed == 902:
            return Heard(text="?", reward="high")
        right = action.message.strip() == str(self.seed)
        return Heard(text=f"again {self.steps}", reward=1.0 if right else 0.0, done=self.steps >= 2)

    @property
    def state(self) -> State:
        return State(step_count=self.steps)


app = create_app(Game, Say, Heard, max_concurrent_envs=64)
