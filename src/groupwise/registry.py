"""One small registry type, used for every component kind.

A registry maps a snake_case name (the paper acronym) to a member and the frozen dataclass that configures
it. Every member of one registry has the same form, and there are two forms, declared by the registry:

  factory  ``factory(cfg, env: BuildEnv) -> component``: stateful or I/O-bound kinds (task, generator,
           buffer, teacher, ...); ``env`` carries what exists when the component is built.
  function ``fn(<input>, cfg) -> <output>``: the pure math kinds (advantage, loss, credit); building one
           binds its config, so the bound component is ``fn(<input>)``.

``Entry.build(cfg, env)`` is the one way every member of every kind is built; the result satisfies the
kind's Protocol (``Registry.protocol``). Optional abilities are declared when a member is registered:
``stateful`` (``state_dict()`` / ``load_state_dict()``, checkpointed), ``reports`` (``metrics() ->
dict[str, float]``, merged into each step's metrics), ``driver_only`` (it must run in the training process:
never in a Ray rollout worker), for generators ``logprobs`` (its completions carry the sampler's own
log-probs; false for a scripted one, which the importance-sampling correction refuses), ``snapshot`` (it
can be built on a frozen copy of the weights: asynchronous rollouts) and ``own_weights`` (its engine holds a
copy of the weights that ``sync_weights`` reloads: asynchronous rollouts load each snapshot into it),
``provides`` / ``requires`` / ``conflicts`` (abilities, plain strings, that members give each other:
``config.check`` refuses a recipe whose selected components require an ability none provides, so no component
checks another by name), and for loss terms ``needs`` (inputs the update must compute, e.g. ``"ref"``,
``"teacher"``) and ``advantage_only`` (loss and gradient vanish where A = 0, so the update may skip such
rows). Unknown names fail with the valid names and the closest match.

Members are found without importing them: ``source_index()`` reads groupwise's own source files for
``NAME = Registry("kind", ...)`` and ``@NAME.register("member", ...)`` lines, and a registry imports a member's
module the first time the member is asked for (``get``), so loading a recipe imports the members it names and
no others. A new member is still one new file: nothing lists it. Users' members register when their plugin
is imported (``plugins.py``), as before.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from groupwise.errors import ConfigError, RunStopped  # noqa: F401  (registry.ConfigError / RunStopped: also used as such)

T = TypeVar("T")
Abilities = tuple[str, ...] | Callable[[Any], tuple[str, ...]]

NEEDS = ("ref", "teacher", "teacher_topk", "teacher_vocab", "vocab")
"""What a loss term may ask the update for: reference log-probs, the teacher's log-probs of the sampled
tokens, its top-k support (+ tail mass) or full-vocabulary log-probs, and the student's own full-vocabulary
log-probs (with grad)."""


def described(out: object) -> str:
    """A returned value in a contract's message: ``a list of Problem, str``, ``a NoneType``."""
    inner = {type(x).__name__ for x in out} if isinstance(out, (list, tuple)) else set()
    return f"a {type(out).__name__}" + (f" of {', '.join(sorted(inner))}" if inner else "")


def anything(*_: object) -> str:
    """The contract of a method whose output is not checked: only its raises and exits are guarded."""
    return ""


def list_of(out: object, cls: type, n: int | None = None) -> bool:
    return isinstance(out, list) and all(isinstance(x, cls) for x in out) and (n is None or len(out) == n)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoConfig:
    """A component without knobs."""


@dataclasses.dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered member: the object as written, its config class and its declared abilities."""

    kind: str
    name: str
    obj: T
    config: type
    form: Literal["factory", "function"]
    stateful: bool = False
    reports: bool = False
    needs: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()
    """What a loss term reads (``NEEDS``); a function of the term's config when that depends on a knob."""
    advantage_only: bool = False
    label: Callable[[Any], str] | None = None
    """``label(cfg)`` names the member's metrics (reward terms); default: the registered name."""
    driver_only: bool = False
    """It must run in the training process, never in a Ray rollout worker (``rollout.workers``): it keeps state
    across calls that is neither checkpointed nor sent to a worker (the ``fake`` generator's row counter), or
    needs the driver's objects. ``stateful`` and ``reports`` members are refused there too: a worker's state
    would be lost with it and its metrics never reach the step's."""
    contract: Callable[..., str] | dict[str, Callable[..., str]] | None = None
    """The kind's output contract (``Registry.contract``); a plug-in of such a kind is built guarded."""
    logprobs: bool = True
    """A generator's ``rollout_logprobs`` are its sampling distribution's (false: scripted values, e.g. the
    ``fake`` generator's constant; ``loss.importance_sampling`` is then refused at load)."""
    snapshot: bool = False
    """A generator built on ``env.policy`` samples from that module alone, so a second one built on a frozen
    copy of the weights samples from the copy (``rollout.max_async_level`` > 0 needs this or ``own_weights``;
    ``loop/lag.py``)."""
    own_weights: bool = False
    """A generator whose engine holds its own copy of the weights, reloaded from the module given to
    ``sync_weights(model)`` before its next generation (vLLM): asynchronous rollouts share it and load each
    snapshot into it."""
    provides: Abilities = ()
    """What this member gives the others of a run (``"think_modes"``: its samples carry their mode; ``"teacher"``;
    ``"policy_gradient"``), a function of its config when that depends on a knob."""
    requires: Abilities = ()
    """Abilities some other selected component must provide (checked at load, ``config.check``): a component
    never checks another by its name."""
    conflicts: Abilities = ()
    """Abilities no other selected component may provide (e.g. the same factor applied twice)."""

    @property
    def origin(self) -> str:
        """The module that registered it (``groupwise.*`` for built-ins, else a plugin)."""
        return getattr(self.obj, "__module__", "") or ""

    @property
    def builtin(self) -> bool:
        return self.origin.startswith("groupwise.")

    def build(self, cfg: Any, env: Any = None) -> Any:
        if self.contract is not None and not self.builtin:  # users' code: a failure or bad output: one line
            from groupwise.plugins import guarded

            return guarded(self, cfg, env)
        if self.form == "function":
            return functools.partial(self.obj, cfg=cfg)
        return self.obj(cfg, env)

    def needs_of(self, cfg: Any) -> tuple[str, ...]:
        needs = tuple(self.needs(cfg)) if callable(self.needs) else self.needs
        bad = [n for n in needs if n not in NEEDS]
        if bad:
            raise TypeError(f"{self.kind} '{self.name}': unknown needs {bad}; allowed: {', '.join(NEEDS)}")
        return needs

    def abilities(self, which: str, cfg: Any) -> tuple[str, ...]:
        """``provides`` / ``requires`` / ``conflicts`` for the member's config ``cfg``."""
        value = getattr(self, which)
        return tuple(value(cfg)) if callable(value) else tuple(value)

    def metric_name(self, cfg: Any) -> str:
        return self.label(cfg) if self.label is not None else self.name


@dataclasses.dataclass(frozen=True)
class BuildEnv:
    """What a factory may use, filled in as the pipeline is built (task first, then the model, then the rest).

    ``initial_policy()`` returns a frozen, no-grad copy of the policy's initial weights, made once on first
    use and shared (the KL reference and a ``frozen`` teacher are the same copy); ``encode(problem)`` gives
    the prompt token ids the generator sees."""

    run: Any
    seed: int = 0
    task: Any = None
    policy: Any = None
    tokenizer: Any = None
    initial_policy: Callable[[], Any] | None = None
    encode: Callable[[Any], Any] | None = None


class Registry(Generic[T]):
    """Members of one component kind. ``protocol`` is what a built member satisfies; ``params`` the names of
    the member's parameters (checked at registration, so a wrong signature fails at import time).
    ``contract(output, *inputs) -> str`` says what is wrong with a call's output ("" when nothing); for a
    factory-built kind it may be a dict naming the methods it checks (``{"next": ...}``; a plain function
    checks ``__call__``). A plug-in of a kind with a contract is built inside a guard (``plugins.guarded``)
    that checks every output once, where the core receives it, and turns a raise, a ``sys.exit`` or a broken
    contract into one line naming it."""

    def __init__(self, kind: str, protocol: type, form: Literal["factory", "function"], params: tuple[str, ...],
                 optional: bool = False, contract: Callable[..., str] | dict[str, Callable[..., str]] | None = None):
        self.kind, self.protocol, self.form, self.params = kind, protocol, form, params
        self.optional = optional  # a member may build to None (e.g. teacher 'none')
        self.contract = contract
        self._entries: dict[str, Entry[T]] = {}

    @property
    def signature(self) -> str:
        return f"{'factory' if self.form == 'factory' else 'fn'}({', '.join(self.params)}) -> {self.protocol.__name__}"

    def register(self, name: str, config: type = NoConfig, *, stateful: bool = False, reports: bool = False,
                 needs: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = (), advantage_only: bool = False,
                 label: Callable[[Any], str] | None = None, driver_only: bool = False,
                 logprobs: bool = True, snapshot: bool = False, own_weights: bool = False,
                 provides: Abilities = (), requires: Abilities = (), conflicts: Abilities = ()) -> Callable[[T], T]:
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"{self.kind} '{name}': config must be a dataclass, got {config!r}")
        bad = [] if callable(needs) else [n for n in needs if n not in NEEDS]
        if bad:
            raise TypeError(f"{self.kind} '{name}': unknown needs {bad}; allowed: {', '.join(NEEDS)}")

        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice "
                                 f"({self._entries[name].origin} and {getattr(obj, '__module__', '?')})")
            _check_params(self, name, obj)
            self._entries[name] = Entry(self.kind, name, obj, config, self.form, stateful, reports,
                                        needs if callable(needs) else tuple(needs), advantage_only, label,
                                        driver_only, self.contract, logprobs, snapshot, own_weights, provides,
                                        requires, conflicts)
            return obj

        return deco

    def get(self, name: str, where: str = "") -> Entry[T]:
        module = None if name in self._entries else source_index().get(self.kind, {}).get(name)
        if module is not None:
            importlib.import_module(module)  # its decorator registers it
        if name not in self._entries:
            valid = ", ".join(self.names()) or "(none)"
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            at = f"{where}: " if where else ""
            raise ConfigError(f"{at}unknown {self.kind} '{name}'{hint}; valid: {valid}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Every member's name: registered ones and groupwise's own not imported yet."""
        return sorted({*self._entries, *self._unloaded()})

    def loaded(self) -> dict[str, Entry[T]]:
        """The members registered so far, by name: plug-ins, and groupwise's own that were imported."""
        return dict(self._entries)

    def entries(self) -> list[Entry[T]]:
        """Every member, each imported."""
        return [self.get(n) for n in self.names()]

    def __contains__(self, name: str) -> bool:
        return name in self._entries or name in self._unloaded()

    def _unloaded(self) -> dict[str, str]:
        """groupwise's own members of this kind that are not registered yet: name -> module."""
        return {n: m for n, m in source_index().get(self.kind, {}).items() if n not in self._entries}


def _check_params(reg: Registry[Any], name: str, obj: Any) -> None:
    try:
        got = tuple(inspect.signature(obj).parameters)[:len(reg.params)]
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    if got != reg.params:
        raise TypeError(f"{reg.kind} '{name}': a {reg.kind} {reg.form} takes ({', '.join(reg.params)}), "
                        f"got ({', '.join(got)})")


_SOURCE = Path(__file__).resolve().parent
_REGISTRY = re.compile(r'^(\w+) = Registry\(\s*"([^"]+)"', re.M)
_MEMBER = re.compile(r'^@(\w+)\.register\(\s*"([^"]+)"', re.M)


@functools.cache
def source_index() -> dict[str, dict[str, str]]:
    """kind -> {member name: the module that registers it}, for groupwise's own members, read from the source
    files without importing them (``tests/test_layers.py`` checks it against what importing every module
    registers)."""
    kinds: dict[str, str] = {}  # registry variable -> kind
    found: list[tuple[str, str, str]] = []
    for path in sorted(_SOURCE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "Registry(" not in text and ".register(" not in text:
            continue
        parts = path.relative_to(_SOURCE).with_suffix("").parts
        module = ".".join(("groupwise", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        kinds.update({var: kind for var, kind in _REGISTRY.findall(text)})
        found += [(var, name, module) for var, name in _MEMBER.findall(text)]
    out: dict[str, dict[str, str]] = {}
    for var, name, module in found:
        if var in kinds:
            out.setdefault(kinds[var], {})[name] = module
    return out


def bundles() -> dict[str, dict[str, str]]:
    """method name -> {kind: the module that registers that member}, for every name that one method room registers
    in two or more kinds (read from the source: nothing is imported)."""
    rooms: dict[tuple[str, str], dict[str, str]] = collections.defaultdict(dict)
    for kind, members in source_index().items():
        for name, module in members.items():
            parts = module.split(".")
            if len(parts) > 2 and parts[1] == "methods":
                rooms[(parts[2], name)][kind] = module
    return {name: kinds for (_, name), kinds in sorted(rooms.items()) if len(kinds) >= 2}
