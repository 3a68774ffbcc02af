"""The two exceptions every layer may raise; the CLI prints either as one line."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad recipe, override or component name. The message is one line naming the key and what is allowed."""


class RunStopped(RuntimeError):
    """A run that stopped on purpose (non-finite weights, a federation that stopped answering): the message is
    one line saying why and what was kept; the CLI prints it and exits 1."""
