"""Seeds derived from names: every random draw of a run is seeded from (seed, step, stage, n-th use, ...)."""

from __future__ import annotations

import hashlib


def stable_seed(*parts: object) -> int:
    """A 63-bit seed derived from any printable parts; identical across processes and platforms."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") >> 1
