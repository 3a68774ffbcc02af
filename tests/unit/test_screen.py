"""The run's screen tells the truth (issue 47): no placeholder numbers before the first step, the phase under way
(loading, an eval with its counter, a step's generation and update), the async level and staleness, a piped log
that is never silent for long, and no third-party progress bars through the library."""

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from groupwise import log
from groupwise.log import Progress, advance, counting, work

ROOT = Path(__file__).parents[2]
STEP = {"reward/mean": 0.5, "rollout/completion_len_mean": 11.0, "perf/gen_tokens_per_s": 86237.0,
        "rollout/staleness_mean": 1.0}


def live(**kw) -> tuple[Progress, io.StringIO]:
    from rich.console import Console

    buf = io.StringIO()
    return Progress(80, 0, True, console=Console(file=buf, width=160, force_terminal=True, color_system=None),
                    **kw), buf


def last_frame(buf: io.StringIO) -> str:
    frames = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue().replace("\r", "\n")).splitlines()
    return [f for f in frames if "/80" in f][-1]


def test_the_live_bar_has_no_numbers_before_the_first_step_only_the_phase():
    p, buf = live()
    p.update(0, {})
    with p.phase("loading the model", about="embedded:lab-tiny"):
        p.close()  # the frame drawn on close is the screen while the model loads
    frame = last_frame(buf)
    assert "loading the model" in frame, frame
    assert "0.000" not in frame and "tok/s" not in frame and "reward" not in frame, frame  # before: reward 0.000 …


def test_a_step_shows_its_numbers_and_a_dash_for_what_it_did_not_log():
    p, buf = live()
    p.update(1, STEP)  # no reward/correct_frac this step
    p.close()
    frame = last_frame(buf)
    assert "reward 0.500  acc —  len 11.0  86,237 tok/s" in frame and "staleness" not in frame, frame


def test_an_eval_counts_completions_as_they_finish():
    p, buf = live()
    with p.phase("eval step 0", 10, "2 problems, 10 completions"):
        advance(4)
        with work(3):  # an engine that reports 1 of its 3 completions: the rest counted when it returns
            advance(1)
        p.close()
    assert "eval step 0 (7/10)" in last_frame(buf), last_frame(buf)


def test_an_async_run_says_so_and_shows_its_staleness():
    p, buf = live(async_level=2)
    p.update(3, STEP)
    p.close()
    frame = last_frame(buf)
    assert "train (async K=2)" in frame and "staleness 1.0" in frame, frame


def test_piped_output_says_each_phase_until_the_first_step_then_when_quiet(capsys, monkeypatch):
    p = Progress(100, 0, True)  # stdout captured: not a terminal, plain lines
    with p.phase("eval step 0", 10, "2 problems, 10 completions"):
        advance(4)
    with p.phase("step 1: generating", 8):
        pass
    p.update(1, STEP)
    with p.phase("step 2: generating", 8):  # after the first step: silent, the steps say enough
        pass
    p.update(2, STEP)  # not a tenth of the run
    monkeypatch.setattr(log, "QUIET_S", 0.0)  # nothing said for QUIET_S seconds: say what is under way
    with p.phase("step 3: generating", 8):
        advance(5)
    assert capsys.readouterr().out.splitlines() == [
        "eval step 0: 2 problems, 10 completions", "step 1: generating ...",
        "step 1/100  reward 0.500  acc —  len 11.0  86,237 tok/s", "step 3: generating ...", "step 3: generating: 5/8"]


def test_a_piped_training_run_logs_its_phases_in_order(tmp_path, monkeypatch, capsys):
    from groupwise.cli import main

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    assert main(["train", str(ROOT / "recipes" / "fake_generator_lab.yaml"), "trainer.steps=2", f"out_dir={tmp_path}",
                 "trainer.threads=1", "eval.after=false"]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = ["loading the model: embedded:lab-tiny", "eval step 0: 8 problems, 32 completions",
                "step 1: generating ...", "step 1: updating ...", "step 1/2  reward 0.500"]
    at = [next(i for i, line in enumerate(out) if line.startswith(e)) for e in expected]
    assert at == sorted(at), out
    assert "step 2: generating ..." not in out, out


def test_an_async_session_says_it_is_asynchronous(tmp_path, capsys):
    from groupwise.config import load
    from groupwise.loop.session import Session

    s = Session(load(None, [f"out_dir={tmp_path}", "name=r", "rollout.max_async_level=2"]))
    s.close()
    assert "asynchronous: rollouts sampled up to 2 policy versions behind" in capsys.readouterr().out


def test_the_hf_generator_counts_each_completion_when_it_finishes():
    from transformers import LlamaConfig, LlamaForCausalLM

    from groupwise.loop.pipeline import CountingGenerator
    from groupwise.rollout.base import Request, SamplingParams
    from groupwise.standard.hf import HFConfig, HFGenerator

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                         pad_token_id=0, eos_token_id=1, bos_token_id=1)).eval()
    tokenizer = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 1})()
    gen = CountingGenerator(HFGenerator(HFConfig(), model, tokenizer))
    reqs = [Request(torch.tensor([5, 6, 7]), max_tokens=cap) for cap in (2, 4, 6, 8)]  # rows end at their caps
    seen: list[int] = []
    with counting(seen.append):
        gen.generate(reqs, SamplingParams(max_tokens=8), torch.Generator().manual_seed(0))
    assert sum(seen) == 4 and len(seen) >= 3, seen  # one tick per step in which rows finished, not one at the end


def test_loading_through_the_library_switches_third_party_bars_off(tmp_path, monkeypatch, capfd):
    """transformers' GGUF conversion draws a plain tqdm bar that transformers' own switch did not reach: it
    leaked 40 frames into a piped log, from the CLI too."""
    import importlib
    import os

    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    from groupwise.config import load
    from groupwise.loop.setup import build

    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # (the package's `tqdm` is the class)
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)  # each restored after the test
    monkeypatch.setattr(gguf_utils, "tqdm", gguf_utils.tqdm)
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})
    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(var, raising=False)
    build(load(None, [f"out_dir={tmp_path}", "model.warm_start=false", "trainer.threads=1"]))
    assert not hf_logging.is_progress_bar_enabled() and hub_tqdm.are_progress_bars_disabled()
    capfd.readouterr()
    list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "Converting" not in capfd.readouterr().err
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" == os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"]


def test_switching_bars_off_imports_no_library():
    code = ("import sys; from groupwise.log import quiet_libraries; quiet_libraries(); "
            "print([m for m in ('transformers', 'datasets', 'huggingface_hub', 'tqdm') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


# ---- what loading the model does on first use, and groupwise eval (issue 47 item 2: "a visible phase (warm start,
# conversion, ...)"; before, both were one "loading the model" phase and `groupwise eval` showed nothing)
def frame_at(buf: io.StringIO, counter: str) -> str:
    frames = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue().replace("\r", "\n")).splitlines()
    return [f for f in frames if counter in f][-1]


def test_a_gguf_conversion_is_its_own_phase_then_cached_and_silent(tmp_path, monkeypatch, capsys):
    """The converter is faked (the real one dequantises SmolLM2 in ~79 s): the screen while it runs, live and
    piped, and nothing once the conversion is cached."""
    from groupwise.models import sources

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF, faked")
    monkeypatch.setattr(sources, "gguf_summary", lambda path: ("llama", 1_000_000))
    monkeypatch.setattr(sources, "_check_gguf_arch", lambda path, arch: None)
    p, buf = live()

    def dequantise(path, dest):
        p.close()  # the frame drawn on close is the screen during the conversion
        (dest / "config.json").write_text("{}")

    monkeypatch.setattr(sources, "_dequantise", dequantise)
    p.update(0, {})
    with p.phase("loading the model", about=str(gguf)):
        out = sources.resolve(str(gguf), p)
    assert sources.CONVERTING == "converting the GGUF to fp32 (first use, cached after)"
    assert sources.CONVERTING in last_frame(buf), last_frame(buf)

    piped = Progress(10, 0, True)  # stdout captured: plain lines
    capsys.readouterr()
    (out / "config.json").unlink()  # damaged: converted again
    with piped.phase("loading the model", about=str(gguf)):
        assert sources.resolve(str(gguf), piped) == out
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"loading the model: {gguf}", lines
    assert lines[1] == f"{sources.CONVERTING}: m.gguf (0 MB, llama, 1.0M parameters) into {out}", lines
    assert lines[2].startswith("converted m.gguf in ") and lines[2].endswith(" s (cached: later runs skip this)")
    with piped.phase("loading the model", about=str(gguf)):
        assert sources.resolve(str(gguf), piped) == out
    assert capsys.readouterr().out == f"loading the model: {gguf}\n"  # cached: no conversion phase


def test_a_warm_start_build_is_its_own_phase_counting_its_sft_steps(tmp_path, monkeypatch):
    from groupwise.config import load
    from groupwise.models import warm_start
    from groupwise.models.load import load_model
    from groupwise.registry import BuildEnv

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))  # empty, and 3 steps: no packaged copy
    cfg = load(None, ["model.warm_start_steps=3"])
    task = cfg.task.build(BuildEnv(run=cfg, seed=0))
    p, buf = live()
    steps = []

    def spy(n):
        advance(n)
        steps.append(n)
        if len(steps) == 2:
            p.close()  # the screen after the second SFT step

    monkeypatch.setattr(warm_start, "advance", spy)
    p.update(0, {})
    with p.phase("loading the model", about=cfg.model.path):
        load_model(cfg.model, task, p)
    assert warm_start.BUILDING == "building the warm start (first use, cached after): SFT steps"
    assert f"{warm_start.BUILDING} (2/3)" in last_frame(buf), last_frame(buf)


def test_a_piped_run_says_its_warm_start_is_built_and_counts_it_from_the_cli_and_the_api(tmp_path, monkeypatch,
                                                                                       capsys):
    """Before: "building the warm start (SFT): 2/2 loss ..." lines under the one "loading the model" phase."""
    from groupwise import api
    from groupwise.cli import main
    from groupwise.models.warm_start import BUILDING

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))  # empty: the warm start is built
    monkeypatch.setattr(log, "QUIET_S", 0.0)  # every counter tick said
    recipe = str(ROOT / "recipes" / "fake_generator_lab.yaml")
    args = ["trainer.steps=1", "model.warm_start=true", "model.warm_start_steps=2", "eval.before=false",
            "eval.after=false", "trainer.threads=1"]
    for how, run in (("cli", lambda: main(["train", recipe, *args, f"out_dir={tmp_path / 'cli'}"])),
                     ("api", lambda: api.train(recipe, [*args, f"out_dir={tmp_path / 'api'}"]))):
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)  # built again
        run()
        out = capsys.readouterr().out.splitlines()
        expected = ["loading the model: embedded:lab-tiny", f"{BUILDING}: 2 steps on lab's reference traces, into ",
                    f"{BUILDING}: 1/2", f"{BUILDING}: 2/2", "step 1: generating"]
        at = [next((i for i, line in enumerate(out) if line.startswith(e)), -1) for e in expected]
        assert -1 not in at and at == sorted(at), (how, out)
        assert not any("(cached)" in line for line in out), out


def test_groupwise_eval_shows_its_phases_and_counts_its_completions(tmp_path, monkeypatch, capsys):
    import json

    from groupwise.cli import main
    from groupwise.models import tiny
    from groupwise.models.load import save_model

    tok = tiny.build_tokenizer()
    save_model(tiny.build_model("lab-tiny", tok), tok, tmp_path / "model")
    monkeypatch.setattr(log, "QUIET_S", 0.0)
    args = ["eval", str(tmp_path / "model"), "eval.n_problems=2", "eval.k=2", "rollout.max_completion_tokens=8",
            "trainer.threads=1"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    expected = [f"loading the model: {tmp_path / 'model'}", "eval: 2 problems, 6 completions", "eval: 6/6"]
    at = [next((i for i, line in enumerate(out) if line == e), -1) for e in expected]
    assert -1 not in at and at == sorted(at), out
    assert any("eval/mean_at_k" in line for line in out[at[-1]:]), out  # then the table
    assert main([*args, "--json"]) == 0  # stdout is the JSON; a piped stderr gets no screen
    cap = capsys.readouterr()
    assert "eval/mean_at_k" in json.loads(cap.out) and cap.err == "", cap


def test_a_bar_phase_moves_the_bar_an_unknown_total_first():
    """``groupwise eval``'s screen: its total unknown while the model loads, then its bar its completions."""
    from rich.console import Console

    def screen() -> tuple[Progress, io.StringIO]:
        buf = io.StringIO()
        return Progress(None, 0, True, title="eval", console=Console(file=buf, width=160, force_terminal=True,
                                                                      color_system=None)), buf

    p, buf = screen()
    with p.phase("loading the model"):
        p.close()
    assert "0/?" in frame_at(buf, "loading the model")
    p, buf = screen()
    with p.phase("loading the model"):
        pass
    with p.phase("eval", 10, "2 problems, 10 completions", bar=True):
        advance(4)
        p.close()
    frame = frame_at(buf, "4/10")
    assert frame.startswith("eval ") and frame.rstrip().endswith("eval") and "(4/10)" not in frame, frame
