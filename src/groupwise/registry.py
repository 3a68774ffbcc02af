"""One small registry type, used for every component kind.

A registry maps a snake_case name (the paper acronym) to a builder and the frozen dataclass that
configures it. Every member of one registry has the same call signature; the registry's docstring
(``kind``) says what that signature is. Unknown names fail with the valid names and the closest match.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad recipe, override or component name. The message is one line naming the key and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    config: type


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoConfig:
    """A component without knobs."""


class Registry(Generic[T]):
    def __init__(self, kind: str, signature: str):
        self.kind = kind
        self.signature = signature
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, config: type = NoConfig) -> Callable[[T], T]:
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"{self.kind} '{name}': config must be a dataclass, got {config!r}")

        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = Entry(name, obj, config)
            return obj

        return deco

    def get(self, name: str, where: str = "") -> Entry[T]:
        if name not in self._entries:
            valid = ", ".join(self.names()) or "(none)"
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            at = f"{where}: " if where else ""
            raise ConfigError(f"{at}unknown {self.kind} '{name}'{hint}; valid: {valid}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries


def build(entry: Entry[Any], cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a registered factory with its config (for kinds whose members are factories)."""
    return entry.obj(cfg, *args, **kwargs)
