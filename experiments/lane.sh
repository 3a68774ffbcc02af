#!/bin/bash
# One lane of an experiment's queue: pops the first "arm seed" line of QUEUE (under a lock, so several lanes share
# one queue and its order can be edited while they run), runs that one run with its evals, archives the experiment's
# results (experiments/results/<experiment>, to commit), and repeats until the queue is empty. One torch thread a lane;
# two lanes fill the 2-core machine (two real-model lab runs held ~11 GB together on 2026-12-07, `free -g`). It runs
# the first `python` on PATH: the project's virtual environment's.
#
#   printf 'grpo 0\ngrpo 1\ngarl 0\n' > /tmp/queue.txt
#   (setsid experiments/lane.sh real_lab /tmp/queue.txt > /tmp/laneA.out 2>&1 &)   # and again for a second lane
#
# A line that starts with "-" is passed to the experiment's script as its arguments instead (another of its modes,
# e.g. "--transfer experiments/out/real_lab/grpo-s0"), its output to QUEUE.<the line, one word>.out.
# Each start and end goes to QUEUE.log with the exit status; a run's own output is appended to QUEUE.<arm>-s<seed>.out
# (a job restarted after a stop keeps its earlier output there).
set -u
experiment=$1 queue=$(realpath "$2")
cd "$(dirname "$0")/.."
while true; do
  job=$(flock "$queue.lock" bash -c 'l=$(head -n1 "$0"); [ -n "$l" ] && sed -i 1d "$0"; echo "$l"' "$queue")
  [ -z "$job" ] && break
  if [[ $job == -* ]]; then
    read -r -a args <<< "$job"
    name=$(tr -c 'A-Za-z0-9_.\n-' _ <<< "${job//\//.}")
  else
    read -r arm seed <<< "$job"
    args=(--arms "$arm" --seeds "$seed") name=$arm-s$seed job="$arm s$seed"
  fi
  echo "$(date -Is) START $job" >> "$queue.log"
  OMP_NUM_THREADS=1 PYTHONPATH=src python "experiments/$experiment.py" --jobs 1 "${args[@]}" >> "$queue.$name.out" 2>&1
  rc=$?
  flock "$queue.lock" python experiments/harness.py archive "$experiment" >> "$queue.log" 2>&1
  echo "$(date -Is) END $job rc=$rc" >> "$queue.log"
done
