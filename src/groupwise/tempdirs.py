"""Temporary directories a killed writer leaves behind. A writer names its temporary ``<...>-<pid>`` (its own
pid) and renames it into place when done; a kill midway leaves it, and the next writer removes it once that
process no longer runs (checkpoint saves, the GGUF conversion cache)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def remove_stale(root: Path, patterns: tuple[str, ...] = (".tmp-*",)) -> list[Path]:
    """Remove the entries of ``root`` matching ``patterns`` whose process (the ``-<pid>`` suffix) no longer runs:
    kept only while another process by that pid runs; this process's own, and one without a pid, are stale."""
    removed = []
    for p in sorted(q for pattern in patterns for q in root.glob(pattern)) if root.is_dir() else []:
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process
        return True
    return True
