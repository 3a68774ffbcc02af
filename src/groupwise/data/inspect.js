// groupwise inspect: the report's script (inlined into the page by inspect_report.py; no network, no libraries).
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const RUNS = DATA.runs;
const COLOURS = ["#2563eb", "#dc2626"];
const SIGNALS = {
  advantage: { label: "advantage (after credit)", diverging: true, rgb: [220, 38, 38], neg: [37, 99, 235] },
  loss_weight: { label: "loss weight", diverging: false, rgb: [22, 163, 74] },
  teacher_gap: { label: "teacher gap log πT − log πθ", diverging: true, rgb: [220, 38, 38], neg: [37, 99, 235] },
  mode: { label: "mode token", diverging: false, rgb: [147, 51, 234] },
  // a fixed scale in nats, not the largest |value| shown: |Δ| <= floor (float noise: an fp32 run's gap is ~1e-7)
  // stays uncoloured, and each decade up to max is an equal step of colour (0.01, 0.1, 1 nat: 1/3, 2/3, full)
  sampler_dlogp: { label: "Δ log p sampler − trainer", diverging: true, rgb: [234, 88, 12], neg: [13, 148, 136],
    floor: 1e-3, max: 1 },
};
const FILTERS = {
  all: () => true,
  correct: (s) => s.correct,
  wrong: (s) => !s.correct,
  truncated: (s) => s.finish_reason === "length",
  edited: (s) => s.edited,
  filtered: (s) => s.filtered,
  dropped: (s) => s.dropped,
  replayed: (s) => s.replayed,
};

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k === "cls") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

function svg(tag, attrs, ...kids) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}

function fmt(v, d = 3) {
  if (v === null || v === undefined) return "–";
  const s = Number(v).toFixed(d);
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}

// a per-token number: small ones (a sampler-trainer gap of 1e-6) in exponent form, not rounded to 0
function num(v) {
  if (v === null || v === undefined) return "–";
  return v !== 0 && Math.abs(v) < 1e-3 ? Number(v).toExponential(2) : fmt(v, 4);
}

// ------------------------------------------------------------------------------------------------ curves
function smooth(ys, w) {
  const out = [];
  for (let i = 0; i < ys.length; i++) {
    const win = ys.slice(Math.max(0, i - w + 1), i + 1);
    out.push(win.reduce((a, b) => a + b, 0) / win.length);
  }
  return out;
}

function panel(metric) {
  const W = 300, H = 190, L = 44, R = 8, T = 18, B = 26;
  const series = RUNS.map((run) => {
    const pts = run.metrics.filter((r) => metric in r).map((r) => [r.step, r[metric]]);
    const ys = metric.startsWith("eval/") ? pts.map((p) => p[1]) : smooth(pts.map((p) => p[1]), DATA.smooth);
    return pts.map((p, i) => [p[0], ys[i]]);
  });
  const all = series.flat();
  const g = svg("svg", { width: W, height: H, class: "panel", "data-metric": metric });
  g.append(svg("text", { x: W / 2, y: 12, "text-anchor": "middle", class: "title" }, metric));
  if (!all.length) {
    g.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data"));
    return g;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  g.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#d1d9e0" }));
  for (const [y, v] of [[sy(y0), y0], [sy(y1), y1]]) g.append(svg("text", { x: L - 3, y: y + 3, "text-anchor": "end" }, fmt(v)));
  for (const [x, v] of [[sx(x0), x0], [sx(x1), x1]]) g.append(svg("text", { x, y: H - B + 12, "text-anchor": "middle" }, fmt(v, 0)));
  g.append(svg("text", { x: (L + W) / 2, y: H - 3, "text-anchor": "middle" }, "step"));
  series.forEach((pts, i) => {
    if (!pts.length) return;
    if (metric.startsWith("eval/")) {
      for (const [x, y] of pts) g.append(svg("circle", { cx: sx(x), cy: sy(y), r: 3, fill: COLOURS[i] },
        svg("title", {}, `${RUNS[i].name} step ${x}: ${fmt(y, 4)}`)));
    } else {
      g.append(svg("polyline", { points: pts.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" "), fill: "none",
        stroke: COLOURS[i], "stroke-width": 1.6 }));
    }
  });
  return g;
}

function curves() {
  const legend = el("div", { cls: "legend" }, ...RUNS.map((r, i) =>
    el("span", {}, el("span", { cls: "swatch", style: `background:${COLOURS[i]}` }), r.name)));
  return el("section", { id: "curves-section" }, el("h2", { text: "Curves" }), legend,
    el("p", { cls: "muted", text: `training metrics: trailing mean over ${DATA.smooth} steps; eval metrics: markers` }),
    el("div", { id: "curves" }, ...DATA.curves.map(panel)));
}

// ------------------------------------------------------------------------------------------------ rollouts
const state = { run: 0, step: null, signal: "advantage", filter: "all", search: "", before: "advantage" };

// a value's colour strength in [-1, 1]: v / m (m: the largest |value| shown), or a signal's fixed log scale
function strength(s, v, m) {
  if (!s.floor) return Math.max(-1, Math.min(1, v / (m || 1)));
  const a = Math.abs(v);
  return a <= s.floor ? 0 : Math.sign(v) * Math.min(1, Math.log10(a / s.floor) / Math.log10(s.max / s.floor));
}

function colour(sig, v, m) {
  if (v === null || v === undefined) return null;
  const s = SIGNALS[sig];
  const t = strength(s, v, m);
  const [r, g, b] = t < 0 ? s.neg : s.rgb;
  return `rgba(${r},${g},${b},${(Math.abs(t) * 0.85).toFixed(3)})`;
}

function scaleBar(sig, m) {
  const s = SIGNALS[sig];
  const c = (t) => colour(sig, t * m, m) || "#fff";
  const grad = s.diverging ? `linear-gradient(90deg, ${c(-1)}, #fff, ${c(1)})` : `linear-gradient(90deg, #fff, ${c(1)})`;
  return el("span", { cls: "scale", id: "scale" }, el("span", { text: s.diverging ? num(-m) : "0" }),
    el("span", { cls: "bar", style: `background:${grad}`, title: `${s.label}: colour scale` }),
    el("span", { text: num(m) }), el("span", { cls: "muted", text: s.label }),
    s.floor ? el("span", { cls: "muted", text: `(nats, log scale; |Δ| ≤ ${num(s.floor)} uncoloured)` }) : null,
    el("span", { cls: "tok none", text: " none " , title: "no value: the row was not trained (filtered, dropped)" }));
}

function stepsOf(run) { return RUNS[run].rollouts.map((r) => r.step); }

function visibleGroups() {
  const lines = RUNS[state.run].rollouts.filter((r) => state.step === "all" || r.step === state.step);
  const q = state.search.toLowerCase(), f = FILTERS[state.filter];
  const out = [];
  for (const line of lines) for (const g of line.groups) {
    const head = `${g.problem.id}\n${g.problem.prompt}\n${g.problem.answer}`.toLowerCase();
    const samples = g.samples.filter((s) => f(s) && (!q || head.includes(q) || s.text.toLowerCase().includes(q)));
    if (samples.length) out.push({ step: line.step, g, samples });
  }
  return out;
}

function badges(s) {
  const b = (cls, text, title) => el("span", { cls: `badge ${cls}`, text, title });
  return [s.correct ? b("ok", "correct") : b("bad", "wrong"), s.format_ok ? b("ok", "format ok") : b("bad", "format ✗"),
    s.finish_reason === "length" ? b("warn", "truncated") : null, s.edited ? b("info", "edited", "DRE edit") : null,
    s.filtered ? b("warn", "filtered", "dropped by the filter stage") : null,
    s.dropped ? b("warn", "dropped", "present after the reward stage, absent after the group transforms") : null,
    s.replayed ? b("info", "replayed") : null, s.mode ? b("info", `mode ${s.mode}${s.mode_forced ? " (forced)" : ""}`) : null,
    s.disqualified ? b("bad", `disqualified: ${s.disqualified}`) : null, s.verifier_error ? b("bad", "verifier error") : null];
}

function tokenSpans(s, sig, m, sigNames) {
  const vals = s.signals[sig];
  return s.tokens.map((t, i) => {
    const v = vals ? vals[i] : null;
    const nums = sigNames.map((n) => `${n}=${s.signals[n] ? num(s.signals[n][i]) : "–"}`).join("  ");
    const bg = colour(sig, v, m);
    return el("span", { cls: bg ? "tok" : "tok none", style: bg ? `background:${bg}` : null,
      title: `#${i} ${JSON.stringify(t)}  ${nums}`, text: t });
  });
}

function sampleView(s, sig, m, sigNames) {
  const terms = Object.entries(s.reward_terms).map(([k, v]) => `${k}=${fmt(v)}`).join(" ");
  const meta = el("div", { cls: "meta" }, el("b", { text: `reward ${fmt(s.reward)}` }),
    el("span", { cls: "muted", text: terms ? `(${terms})` : "" }),
    el("span", { text: `adv ${fmt(s.advantage)}`, title: "mean over loss tokens of the advantage after credit" }),
    el("span", { cls: "muted", text: `${s.length} tok, ${s.finish_reason}` }), ...badges(s));
  const div = el("div", { cls: `sample${s.filtered || s.dropped ? " out" : ""}` }, meta,
    el("div", { cls: "tokens" }, ...tokenSpans(s, sig, m, sigNames)));
  return div;
}

function groupView({ step, g, samples }, sig, m, sigNames) {
  const head = el("div", { cls: "head" }, el("span", { cls: "badge kind", text: g.kind }), " ",
    el("b", { text: `step ${step}` }), el("span", { cls: "muted", text: `  ${g.problem.id}  difficulty ${g.problem.difficulty}` +
      (g.kind === "replayed" ? `  (generated at step ${g.from_step})` : "") + `  answer ${g.problem.answer}` }),
    el("div", { cls: "prompt", text: g.problem.prompt }));
  return el("div", { cls: "group", "data-kind": g.kind }, head, ...samples.map((s) => sampleView(s, sig, m, sigNames)));
}

function renderRollouts() {
  const box = document.getElementById("groups");
  box.replaceChildren();
  const run = RUNS[state.run];
  const groups = visibleGroups();
  const sigNames = [...new Set(run.rollouts.flatMap((r) => r.signals))];
  let m = 0;
  for (const { samples } of groups) for (const s of samples) for (const v of s.signals[state.signal] || [])
    if (v !== null) m = Math.max(m, Math.abs(v));
  m = SIGNALS[state.signal].max || m || 1;
  document.getElementById("scale").replaceWith(scaleBar(state.signal, m));
  const total = run.rollouts.filter((r) => state.step === "all" || r.step === state.step)
    .reduce((n, r) => n + r.groups.reduce((k, g) => k + g.samples.length, 0), 0);
  const shown = groups.reduce((n, x) => n + x.samples.length, 0);
  document.getElementById("count").textContent = `${shown} of ${total} rollouts shown`;
  if (!run.rollouts.length) box.append(el("p", { cls: "note", text: "no rollouts recorded (trainer.record_groups=0, or a run from before recording)" }));
  for (const x of groups) box.append(groupView(x, state.signal, m, sigNames));
}

function select(id, options, value, onchange) {
  const s = el("select", { id }, ...options.map(([v, label]) => el("option", { value: String(v), text: label })));
  s.value = String(value);
  s.addEventListener("change", () => onchange(s.value));
  return s;
}

function rolloutControls() {
  const run = RUNS[state.run];
  const steps = stepsOf(state.run);
  if (state.step !== "all" && !steps.includes(state.step)) state.step = steps.length ? steps[steps.length - 1] : "all";
  const sigs = [...new Set(run.rollouts.flatMap((r) => r.signals))].filter((s) => s in SIGNALS);
  if (!sigs.includes(state.signal)) state.signal = sigs[0] || "advantage";
  const rerender = () => { document.getElementById("controls").replaceWith(rolloutControls()); renderRollouts(); };
  const kids = [];
  if (RUNS.length > 1) kids.push(el("label", {}, "run", select("run", RUNS.map((r, i) => [i, r.name]), state.run,
    (v) => { state.run = Number(v); rerender(); })));
  kids.push(el("label", {}, "step", select("step", [["all", "all steps"], ...steps.map((s) => [s, `step ${s}`])], state.step,
    (v) => { state.step = v === "all" ? "all" : Number(v); renderRollouts(); })));
  kids.push(el("label", {}, "colour by", select("signal", (sigs.length ? sigs : ["advantage"]).map((s) => [s, SIGNALS[s].label]),
    state.signal, (v) => { state.signal = v; rerender(); })));
  if (sigs.includes("sampler_dlogp")) {  // the toggle: colour by the sampler-trainer gap, and back
    const box = el("input", { type: "checkbox", id: "dlogp" });
    box.checked = state.signal === "sampler_dlogp";
    box.addEventListener("change", () => {
      if (box.checked) [state.before, state.signal] = [state.signal, "sampler_dlogp"];
      else state.signal = state.before === "sampler_dlogp" ? "advantage" : state.before;
      rerender();
    });
    kids.push(el("label", { title: "colour tokens by log q − log π_old: the sampler's log-prob minus the trainer's" },
      box, " Δ log p"));
  }
  kids.push(el("label", {}, "show", select("filter", Object.keys(FILTERS).map((f) => [f, f]), state.filter,
    (v) => { state.filter = v; renderRollouts(); })));
  const search = el("input", { type: "search", id: "search", placeholder: "search text, prompt, id", value: state.search });
  search.addEventListener("input", () => { state.search = search.value; renderRollouts(); });
  kids.push(search, el("span", { id: "scale" }), el("span", { id: "count", cls: "muted" }));
  return el("div", { cls: "controls", id: "controls" }, ...kids);
}

function rollouts() {
  return el("section", { id: "rollouts-section" }, el("h2", { text: "Rollouts" }),
    el("p", { cls: "muted", text: "tokens are coloured by the chosen per-token signal of the update; hover a token for its numbers" }),
    rolloutControls(), el("div", { id: "groups" }));
}

// ------------------------------------------------------------------------------------------------ eval
const evalState = { steps: RUNS.map((r) => { const k = Object.keys(r.evals).map(Number); return k.length ? Math.max(...k) : null; }),
  onlyDiff: false };

function byProblem(records) {
  const out = new Map();
  for (const r of records || []) {
    if (!out.has(r.id)) out.set(r.id, { difficulty: r.difficulty, greedy: null, sampled: [] });
    const e = out.get(r.id);
    if (r.greedy) e.greedy = r; else e.sampled.push(r);
  }
  return out;
}

function textDiff(a, b) {  // character LCS diff of b against a (both cut to 400 characters)
  a = a.slice(0, 400); b = b.slice(0, 400);
  const n = a.length, m = b.length, dp = Array.from({ length: n + 1 }, () => new Uint16Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
    dp[i][j] = a[i] === b[j] ? dp[i + 1][j + 1] + 1 : Math.max(dp[i + 1][j], dp[i][j + 1]);
  const out = el("pre", { cls: "textdiff" });
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { out.append(a[i]); i++; j++; }
    else if (j < m && (i >= n || dp[i][j + 1] >= dp[i + 1][j])) { out.append(el("ins", { text: b[j] })); j++; }
    else { out.append(el("del", { text: a[i] })); i++; }
  }
  return out;
}

// the share of a problem's sampled completions that are correct: runs with different eval.k compare fractions
function sampledFrac(e) {
  return e && e.sampled.length ? e.sampled.filter((r) => r.correct).length / e.sampled.length : 0;
}

function evalCell(e, other, diffAgainst) {
  if (!e) return [el("td", { text: "–" }), el("td", { text: "–" })];
  const g = e.greedy || e.sampled[0];
  const k = e.sampled.filter((r) => r.correct).length;
  const ok = g ? g.correct : false, oth = other && (other.greedy || other.sampled[0]);
  const cls = oth && oth.correct !== ok ? (ok ? "win" : "lose") : null;
  const head = g ? `${g.correct ? "✓" : "✗"} ${e.greedy ? "greedy" : "sample"} answer ${g.answer ?? "–"}, ${g.length} tok, ${g.finish_reason}` : "";
  const text = g ? (diffAgainst && diffAgainst !== g.text ? textDiff(diffAgainst, g.text) : el("pre", { text: g.text })) : "";
  const f = sampledFrac(e), fo = other ? sampledFrac(other) : f;
  return [el("td", { cls, text: head }, el("br"), text),
    el("td", { cls: fo !== f ? (f > fo ? "win" : "lose") : null, text: `${k}/${e.sampled.length}`, title: "sampled correct" })];
}

function renderEval() {
  const box = document.getElementById("eval-body");
  box.replaceChildren();
  const tables = RUNS.map((r, i) => byProblem(r.evals[String(evalState.steps[i])]));
  const ids = [...new Set(tables.flatMap((t) => [...t.keys()]))];
  const head = el("tr", {}, el("th", { text: "problem" }), el("th", { text: "diff." }),
    ...RUNS.flatMap((r, i) => [el("th", { text: `${r.name} (step ${evalState.steps[i]})`, style: `color:${COLOURS[i]}` }),
      el("th", { text: "sampled ✓" })]));
  const table = el("table", { cls: "eval", id: "eval-table" }, head);
  let differ = 0;
  for (const id of ids) {
    const es = tables.map((t) => t.get(id));
    const g = es.map((e) => (e ? (e.greedy || e.sampled[0]) : null));
    const diff = RUNS.length > 1 && (!g[0] || !g[1] || g[0].correct !== g[1].correct ||
      sampledFrac(es[0]) !== sampledFrac(es[1]));
    differ += diff ? 1 : 0;
    if (evalState.onlyDiff && !diff) continue;
    const cells = es.flatMap((e, i) => evalCell(e, RUNS.length > 1 ? es[1 - i] : null, i === 1 && g[0] ? g[0].text : null));
    table.append(el("tr", { cls: diff ? "diff" : null, "data-id": id }, el("td", { text: id }),
      el("td", { text: es.find((e) => e)?.difficulty ?? "" }), ...cells));
  }
  const acc = tables.map((t) => [...t.values()].filter((e) => (e.greedy || e.sampled[0])?.correct).length);
  const ks = tables.map((t) => Math.max(0, ...[...t.values()].map((e) => e.sampled.length)));
  const kNote = RUNS.length > 1 && ks[0] !== ks[1] ?
    `; eval.k differs (${ks[0]} vs ${ks[1]} samples a problem): sampled ✓ is compared as a fraction` : "";
  box.append(el("p", { id: "eval-summary", text: `${ids.length} held-out problems; correct: ` +
    RUNS.map((r, i) => `${r.name} ${acc[i]}`).join(", ") + (RUNS.length > 1 ? `; the runs differ on ${differ}` : "") +
    kNote }));
  if (!ids.length) box.append(el("p", { cls: "note", text: "no eval records (eval/step_*.jsonl)" }));
  else box.append(table);
}

function evalSection() {
  const kids = RUNS.map((r, i) => el("label", {}, r.name, select(`eval-step-${i}`,
    Object.keys(r.evals).map(Number).sort((a, b) => a - b).map((s) => [s, `step ${s}`]), evalState.steps[i],
    (v) => { evalState.steps[i] = Number(v); renderEval(); })));
  if (RUNS.length > 1) {
    const cb = el("input", { type: "checkbox", id: "only-diff" });
    cb.addEventListener("change", () => { evalState.onlyDiff = cb.checked; renderEval(); });
    kids.push(el("label", {}, cb, "only differences"));
  }
  return el("section", { id: "eval-section" }, el("h2", { text: RUNS.length > 1 ? "Held-out problems, side by side" : "Held-out problems" }),
    el("p", { cls: "muted", text: "greedy completion (or the first sample without greedy eval); rows where the runs differ are highlighted, and the second run's text is diffed against the first's" }),
    el("div", { cls: "controls" }, ...kids), el("div", { id: "eval-body" }));
}

// ------------------------------------------------------------------------------------------------ page
function header() {
  const line = (r) => {
    const steps = r.metrics.filter((m) => "perf/step_s" in m).length;
    const cost = r.rollouts.map((x) => x.cost?.record_s || 0);
    const mean = cost.length ? cost.reduce((a, b) => a + b, 0) / cost.length : 0;
    return el("div", {}, el("span", { cls: "swatch", style: `background:${COLOURS[RUNS.indexOf(r)]}` }), el("b", { text: r.name }),
      el("span", { cls: "muted", text: `  ${r.dir}: ${steps} steps logged, ${r.rollouts.length} recorded, recording ${fmt(mean * 1000, 1)} ms/step` }),
      r.config ? el("details", {}, el("summary", { text: "resolved config" }), el("pre", { cls: "config", text: r.config })) : null);
  };
  return el("header", {}, el("h1", { text: "groupwise inspect" }), ...RUNS.map(line));
}

document.body.append(header(), curves(), rollouts(), evalSection());
renderRollouts();
renderEval();
