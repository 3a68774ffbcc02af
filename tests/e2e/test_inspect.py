"""``groupwise inspect`` in a real headless browser (Debian's chromium driven by playwright, from file://).

Two tiny runs on the same held-out problems (grpo_lab, and distill_frozen_lab, which has a teacher), 2 steps
each with the smoke overrides and recording on; the report of one run and of both is loaded offline and
checked: no console errors, no request leaves file://, the recorded rollouts and their tokens render, the
filters, the search and the signal selector change what is shown, the curves are drawn, and the two-run
table highlights the problems on which the runs differ. Screenshots go to ``$GROUPWISE_ARTIFACTS`` (default:
the test's tmp dir). Without /usr/bin/chromium the test fails (CI installs it: .ci/run) unless
GROUPWISE_ALLOW_NO_BROWSER=1.
"""

import json
import os
import re
from pathlib import Path

import pytest

from groupwise.cli import main
from groupwise.config import load
from groupwise.loop.trainer import train

ROOT = Path(__file__).parents[2]
BROWSER = Path("/usr/bin/chromium")
LAUNCH = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SMOKE = ["trainer.steps=2", "trainer.save_every=1", "trainer.threads=1", "trainer.progress=false",
         "trainer.sinks=[jsonl]", "rollout.prompts_per_step=2", "rollout.max_completion_tokens=24",
         "model.warm_start_steps=15", "eval.n_problems=4", "eval.k=2", "eval.before=false",
         "trainer.record_groups=2",  # the smoke overrides of tests/smoke/test_recipes.py, recording on
         "reward.terms=[{name: correctness}, {name: length_penalty, max_length: 24}]"]  # lengths vary: A != 0


def require_browser():
    """playwright's ``sync_playwright``, once the system browser is known to be there (checked before training)."""
    if not BROWSER.exists():
        if os.environ.get("GROUPWISE_ALLOW_NO_BROWSER") == "1":
            pytest.skip(f"{BROWSER} is missing and GROUPWISE_ALLOW_NO_BROWSER=1")
        pytest.fail(f"{BROWSER} is missing: apt-get install -y chromium (or set GROUPWISE_ALLOW_NO_BROWSER=1 to skip)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -e '.[dev]' (never `playwright install`)")
    return sync_playwright


def playwright():
    return require_browser()()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    require_browser()
    out = tmp_path_factory.mktemp("inspect")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GROUPWISE_CACHE", str(tmp_path_factory.getbasetemp() / "groupwise-cache"))
        mp.chdir(ROOT)
        for recipe in ("grpo_lab", "distill_frozen_lab"):
            train(load(ROOT / "recipes" / f"{recipe}.yaml", [*SMOKE, f"out_dir={out}"]))
    a, b = out / "grpo_lab", out / "distill_frozen_lab"
    records = [json.loads(x) for x in (b / "eval" / "step_2.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["greedy"])
    first["correct"] = not first["correct"]  # the runs then differ on at least this problem
    (b / "eval" / "step_2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return a, b


def lines(run):
    return [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]


def samples(line):
    return [s for g in line["groups"] for s in g["samples"]]


def open_page(pw, report):
    browser = pw.chromium.launch(executable_path=str(BROWSER), args=LAUNCH)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors, requests = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri())
    page.wait_for_selector("#groups .sample")
    return browser, page, errors, requests


def artifacts(tmp_path) -> Path:
    path = Path(os.environ.get("GROUPWISE_ARTIFACTS", tmp_path))
    path.mkdir(parents=True, exist_ok=True)
    return path


def shown(page) -> tuple[int, int]:
    return page.locator("#groups .sample").count(), page.locator("#groups .tok").count()


def test_one_run_report(runs, tmp_path):
    a, _ = runs
    report = tmp_path / "one.html"
    assert main(["inspect", str(a), "--out", str(report)]) == 0
    recorded = lines(a)
    assert [x["step"] for x in recorded] == [1, 2] and all(len(x["groups"]) <= 2 * 4 for x in recorded)
    with playwright() as pw:
        browser, page, errors, requests = open_page(pw, report)
        last = samples(recorded[-1])
        assert shown(page) == (len(last), sum(s["length"] for s in last))  # the last step by default
        assert page.locator("#count").inner_text() == f"{len(last)} of {len(last)} rollouts shown"
        page.select_option("#step", "all")
        every = [s for x in recorded for s in samples(x)]
        assert shown(page) == (len(every), sum(s["length"] for s in every))
        coloured = page.locator("#groups .tok[style*='rgba']").count()
        assert 0 < coloured <= shown(page)[1], "no token is coloured by its advantage"
        assert "advantage=" in page.locator("#groups .tok").first.get_attribute("title")
        for name, keep in (("correct", lambda s: s["correct"]), ("wrong", lambda s: not s["correct"]),
                           ("truncated", lambda s: s["finish_reason"] == "length")):
            page.select_option("#filter", name)
            assert shown(page)[0] == sum(map(keep, every)), name
        assert sum(s["correct"] for s in every) != len(every)  # so "correct" showed fewer than all
        page.select_option("#filter", "all")
        word = every[0]["text"][:6]
        page.fill("#search", word)
        assert shown(page)[0] == sum(word.lower() in s["text"].lower() for s in every) >= 1
        page.fill("#search", "")
        page.select_option("#signal", "loss_weight")
        assert "loss weight" in page.locator("#scale").inner_text()
        assert "sampler_dlogp" in recorded[-1]["signals"]  # the hf generator's log-probs: the gap is recorded
        page.check("#dlogp")  # the toggle: colour by the sampler-trainer gap ...
        assert "Δ log p sampler − trainer" in page.locator("#scale").inner_text()
        assert page.locator("#signal").input_value() == "sampler_dlogp"
        assert "sampler_dlogp=" in page.locator("#groups .tok").first.get_attribute("title")
        page.uncheck("#dlogp")  # ... and back to the signal shown before
        assert page.locator("#signal").input_value() == "loss_weight"
        assert page.locator("#curves svg").count() == 4 and page.locator("#curves polyline").count() >= 2
        page.select_option("#signal", "advantage")
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(artifacts(tmp_path) / "inspect_one_run.png"), full_page=True)
        browser.close()
    assert errors == [] and all(u.startswith(("file://", "data:")) for u in requests), (errors, requests)


def test_two_run_report(runs, tmp_path):
    a, b = runs
    report = tmp_path / "two.html"
    assert main(["inspect", str(a), str(b), "--out", str(report)]) == 0
    assert main(["inspect", str(a), str(b), str(a), "--out", str(report)]) == 2
    evals = [[json.loads(x) for x in (r / "eval" / "step_2.jsonl").read_text().splitlines()] for r in (a, b)]
    greedy = [{r["id"]: r["correct"] for r in ev if r["greedy"]} for ev in evals]
    sampled = [{i: sum(r["correct"] for r in ev if not r["greedy"] and r["id"] == i) for i in g}
               for ev, g in zip(evals, greedy)]
    differ = sorted(i for i in greedy[0] if greedy[0][i] != greedy[1][i] or sampled[0][i] != sampled[1][i])
    assert differ  # the fixture flipped one verdict
    with playwright() as pw:
        browser, page, errors, requests = open_page(pw, report)
        rows = page.locator("#eval-table tr[data-id]")
        assert rows.count() == len(greedy[0]) == 4
        assert page.locator("#eval-table th").count() == 2 + 2 * 2  # problem, difficulty; per run: greedy, sampled
        assert sorted(page.locator("#eval-table tr.diff").evaluate_all("rs => rs.map(r => r.dataset.id)")) == differ
        assert page.locator("#eval-table td.win").count() + page.locator("#eval-table td.lose").count() >= 1
        page.check("#only-diff")
        assert page.locator("#eval-table tr[data-id]").count() == len(differ)
        page.select_option("#run", "1")  # the distillation run: its tokens can be coloured by the teacher gap
        last = samples(lines(b)[-1])
        assert shown(page) == (len(last), sum(s["length"] for s in last))
        page.select_option("#signal", "teacher_gap")
        assert page.locator("#groups .tok[style*='rgba']").count() > 0
        assert "teacher_gap=" in page.locator("#groups .tok").first.get_attribute("title")
        assert page.locator("#curves polyline").count() >= 4  # both runs in every training panel
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(artifacts(tmp_path) / "inspect_two_runs.png"), full_page=True)
        browser.close()
    assert errors == [] and all(u.startswith(("file://", "data:")) for u in requests), (errors, requests)


def test_runs_with_different_eval_k_compare_fractions(runs, tmp_path):
    """Issue 31: a run with eval.k 4 against one with 2 compared raw counts (2/4 'better' than 1/2) and counted
    every such problem as a difference."""
    import shutil

    _, b = runs
    records = [json.loads(x) for x in (b / "eval" / "step_2.jsonl").read_text().splitlines()]
    copies = []
    for k in (2, 4):  # the same greedy verdicts, and half of each problem's samples right at either k
        run = tmp_path / f"k{k}" / b.name
        shutil.copytree(b, run)
        out, seen = [], {}
        for r in records:
            if r["greedy"]:
                out.append(r)
            elif seen.setdefault(r["id"], 0) == 0:  # one sampled record per problem, expanded to k
                seen[r["id"]] = 1
                out += [{**r, "correct": j % 2 == 0} for j in range(k)]
        (run / "eval" / "step_2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
        copies.append(run)
    report = tmp_path / "k.html"
    assert main(["inspect", *map(str, copies), "--out", str(report)]) == 0
    with playwright() as pw:
        browser, page, errors, _ = open_page(pw, report)
        assert page.locator("#eval-table tr[data-id]").count() == 4
        assert page.locator("#eval-table tr.diff").count() == 0
        assert page.locator("#eval-table td.win").count() + page.locator("#eval-table td.lose").count() == 0
        assert "eval.k differs (2 vs 4 samples a problem)" in page.locator("#eval-summary").inner_text()
        browser.close()
    assert errors == []


def synthetic_run(tmp_path, texts, dlogp=None):
    """A run directory with one recorded step of one group: a sample per text, one character a token (as
    SmolLM2 splits digits), with each sample's ``sampler_dlogp`` per token from ``dlogp`` (default 0). No training,
    no model."""
    dlogp = dlogp or [[0.0] * len(t) for t in texts]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    samples = [{"text": t, "reward": 1.0, "reward_terms": {}, "correct": True, "format_ok": True, "length": len(t),
                "finish_reason": "stop", "edited": False, "mode": None, "mode_forced": None, "disqualified": None,
                "verifier_error": False, "filtered": False, "dropped": False, "replayed": False, "advantage": 0.5,
                "tokens": list(t), "sampler_logprobs": [-1.0] * len(t),
                "signals": {"advantage": [0.5] * len(t), "sampler_dlogp": d}}
               for t, d in zip(texts, dlogp)]
    line = {"step": 1, "signals": ["advantage", "sampler_dlogp"], "cost": {"record_s": 0.001},
            "groups": [{"kind": "trained", "from_step": 1, "samples": samples,
                        "problem": {"id": "p", "prompt": "q", "answer": "7", "difficulty": None}}]}
    (run / "rollouts.jsonl").write_text(json.dumps(line) + "\n")
    report = tmp_path / "r.html"
    assert main(["inspect", str(run), "--out", str(report)]) == 0
    return report


def alphas(page) -> list[list[float]]:
    """Each sample's tokens' background alpha (0: uncoloured)."""
    return page.locator("#groups .tokens").evaluate_all("""ds => ds.map(d => [...d.children].map(t => {
        const m = getComputedStyle(t).backgroundColor.match(/rgba?\\(([^)]*)\\)/)[1].split(",");
        return m.length === 4 ? Number(m[3]) : 1; }))""")


def test_dlogp_colours_float_noise_as_noise(tmp_path):
    """Issue 47 item 3. Before: scaled to the largest |Δ| shown, a sample of pure float noise (±2e-6) was painted
    at full strength. Now a fixed log scale in nats: |Δ| ≤ 1e-3 uncoloured, 0.01 / 0.1 / ≥ 1 nat at a third /
    two thirds / all of the colour (alpha 0.85 at full)."""
    noise = [2e-6, -2e-6, 1e-6, -1e-7]
    graded = [1e-3, -0.01, 0.1, -1.0, 3.0, 5e-4]
    report = synthetic_run(tmp_path, ["1234", "abcdef"], [noise, graded])
    with playwright() as pw:
        browser, page, errors, _ = open_page(pw, report)
        page.check("#dlogp")
        got, scale = alphas(page), page.locator("#scale").inner_text()
        page.fill("#search", "1234")  # the noise alone on the page
        (alone,) = alphas(page)
        browser.close()
    assert errors == []
    assert got[0] == alone == [0, 0, 0, 0]
    assert got[1] == pytest.approx([0, 0.85 / 3, 0.85 * 2 / 3, 0.85, 0.85, 0], abs=5e-3)  # alpha kept to 8 bits
    assert "-1\n1\nΔ log p" in scale and "log scale; |Δ| ≤ 0.001 uncoloured" in scale


def test_wrapped_lines_do_not_break_inside_a_number(tmp_path):
    """Issue 47 item 3. Before: ``word-break: break-all`` on the token box let a line break between any two
    tokens, so a number of one-digit tokens was cut across lines."""
    text = " ".join(f"x{i}={123456789 + 1111 * i}.{i:03d}" for i in range(60))
    report = synthetic_run(tmp_path, [text])
    with playwright() as pw:
        browser, page, errors, _ = open_page(pw, report)
        page.set_viewport_size({"width": 420, "height": 1000})
        tops = page.locator("#groups .tokens").first.evaluate(
            "d => [...d.children].map(t => Math.round(t.getBoundingClientRect().top))")
        browser.close()
    assert errors == [] and len(tops) == len(text)
    assert len(set(tops)) > 5  # it wraps
    for word in re.finditer(r"\S+", text):  # each "x7=123464566.007" on one line
        assert len({tops[i] for i in range(word.start(), word.end())}) == 1, word.group()
