"""An OpenEnv environment written against OpenEnv's own API (``openenv.core``: an ``Environment`` with ``reset`` /
``step`` / ``state``, served by ``create_app``); nothing in it is groupwise's. It asks a chain of additions modulo
10, as the reasoning lab does (``3+5+2+7``); the agent answers with ``<answer>N</answer>``. A right first answer
scores 1, a right second answer (after "wrong, try again") 0.5, and the episode ends at a right answer or after
two tries.

    uvicorn --app-dir examples openenv_chain:app --port 8000      # serve it, as any OpenEnv environment
    # a groupwise recipe: the server at a URL, or started by groupwise on loopback from this file
    task: {name: openenv, app: examples/openenv_chain.py:app, observation_field: prompt, action_field: message}
    rollout: {tools: {protocol: chat, max_turns: 2}}
    reward: {terms: [{name: environment}]}
"""

import random
import re
import uuid

from openenv.core.env_server import Action, Environment, Observation, State, create_app

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
TRIES = 2


class ChainAction(Action):
    message: str


class ChainObservation(Observation):
    prompt: str = ""


class ChainEnv(Environment[ChainAction, ChainObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # every WebSocket session gets its own instance

    def __init__(self):
        super().__init__()
        self._state, self.chain, self.value, self.tries = State(), "", 0, 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> ChainObservation:
        rng = random.Random(seed)
        xs = [rng.randrange(10) for _ in range(4)]
        self.chain, self.value, self.tries = "+".join(map(str, xs)), sum(xs) % 10, 0
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return ChainObservation(prompt=self.chain)

    def step(self, action: ChainAction, timeout_s=None, **kwargs) -> ChainObservation:
        self.tries += 1
        self._state.step_count += 1
        found = ANSWER.findall(action.message)
        right = bool(found) and found[-1].strip() == str(self.value)
        if right or self.tries >= TRIES:
            return ChainObservation(prompt="", done=True, reward=(1.0 if self.tries == 1 else 0.5) if right else 0.0)
        return ChainObservation(prompt=f"wrong, try again: {self.chain}", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(ChainEnv, ChainAction, ChainObservation, max_concurrent_envs=1024)
