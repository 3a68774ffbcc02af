"""User code in forked workers (``groupwise/isolation.py``) cannot outlive the run or take the machine's memory:
each worker leads its own process group, ended with it (a close, a timeout kill, the run's exit), and its address
space is capped at what it inherited plus ``reward.worker_memory_mb`` (issue 48, item 6)."""

import errno
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from groupwise.isolation import CAN_FORK, WORKER_MEMORY_MB, Forked, VerifierFailed, VerifierTimeout
from groupwise.registry import ConfigError
from groupwise.rewards.stage import RewardStage
from groupwise.types import Group, Problem, Sample

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(not CAN_FORK, reason="process isolation needs fork (Linux)")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pids, seconds=10.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def forks(prompts, completions, **kwargs):
    """A reward function that starts a helper and leaves it running: ``sleep 60`` inherits the worker's stdout
    and stderr, which are the run's."""
    child = subprocess.Popen(["sleep", "60"])
    with open(os.environ["GROUPWISE_TEST_CHILDREN"], "a") as f:
        f.write(f"{child.pid}\n")
    return [0.0] * len(completions)


def spawn(seconds, pidfile=None):
    """A call that starts ``sleep 60`` (its pid written to ``pidfile``) and then runs ``seconds`` (into a timeout
    kill, or a normal return)."""
    child = subprocess.Popen(["sleep", "60"])
    if pidfile:
        Path(pidfile).write_text(str(child.pid))
    time.sleep(seconds)
    return child.pid


def test_a_reward_function_that_forks_does_not_hold_the_runs_pipes_or_outlive_it(tmp_path):
    """Issue 48.6: the run exited 0 but ``sleep 60`` kept its stdout / stderr open (a piped caller waited a
    minute) and lived on. The worker leads a process group that the run ends at exit."""
    pids = tmp_path / "children"
    env = {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "GROUPWISE_TEST_CHILDREN": str(pids),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "groupwise.cli", "train", "recipes/fake_generator_lab.yaml", "trainer.steps=1",
           f"out_dir={tmp_path}", "eval.before=false", "eval.after=false", "trainer.progress=false",
           f"reward.terms=[correctness, {{name: python, function: '{__file__}:forks'}}]"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.wait(timeout=300) == 0
        try:
            proc.communicate(timeout=10)  # EOF on both pipes: nothing holds them any more
        except subprocess.TimeoutExpired:
            pytest.fail("the run exited, but its stdout / stderr stayed open (a piped caller would wait)")
    finally:
        proc.kill()
    children = [int(x) for x in pids.read_text().split()]
    assert children and gone(children, 5), f"the reward function's children outlived the run: {children}"


def test_closing_or_killing_a_worker_ends_its_children(tmp_path):
    """A worker's children go with it: at a timeout kill (the call overran) and at a normal close."""
    w = Forked(spawn, 2.0, "reward function")
    with pytest.raises(VerifierTimeout):
        w(30, str(tmp_path / "pid"))
    assert gone([int((tmp_path / "pid").read_text())], 5), "a timed-out call's child outlived its killed worker"
    w.timeout_s = 5.0
    pid = w(0)  # a fresh worker; this call's child outlives the call, not the worker
    assert alive(pid)
    w.close()
    assert gone([pid], 5)


def test_a_worker_whose_trainer_is_killed_ends_its_children():
    """A trainer killed outright (SIGKILL: no exit handlers) leaves neither workers nor their children."""
    script = ("import sys, time\n"
              f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "from test_isolation import spawn\n"
              "from groupwise.isolation import Forked\n"
              "w = Forked(spawn, 5.0)\n"
              "child = w(0)\n"
              "print(w._proc.pid, child, flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    proc.kill()
    proc.wait()
    assert gone(pids, 10), "the worker or its child outlived a killed trainer"


def hog(problem, text):
    """A verifier whose memory grows slowly (10 MB at a time) on one input, to 1 GiB (far past the tests' caps; a
    bound, so that a cap that failed to apply fails the test rather than taking the machine)."""
    if text == "hog":
        grow()
    return text == problem.answer


def grow():
    """10 MB at a time, each its own mapping (``written_mapping``: a ``bytearray`` could be served from the trainer's
    freed heap, which the forked worker maps in already and its cap counts as inherited, and a long test session
    leaves plenty); the cap's ENOMEM surfaces as the MemoryError an allocator raises."""
    chunks = []
    try:
        for _ in range(103):
            chunks.append(written_mapping(10))
    except OSError as e:
        if e.errno == errno.ENOMEM:
            raise MemoryError(str(e)) from e
        raise
    return len(chunks)


def written_mapping(mb: int) -> mmap.mmap:
    """``mb`` MB in an anonymous mapping of its own (new address space, as a large tensor's buffer is), every page
    written (real memory, as a real leak's or an eval buffer's)."""
    m = mmap.mmap(-1, mb * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m[::mmap.PAGESIZE] = b"x" * (len(m) // mmap.PAGESIZE)
    return m


class HogTask:
    name = "hog"

    def verify(self, problem, text):
        return hog(problem, text)


def leaky(prompts, completions, **kwargs):
    if "hog" in completions:
        grow()
    return [1.0] * len(completions)


def sample(text):
    z = torch.zeros(1, dtype=torch.long)
    return Sample(prompt_ids=z, completion_ids=z, rollout_logprobs=torch.zeros(1),
                  loss_mask=torch.ones(1, dtype=torch.bool), finish_reason="stop", text=text)


def test_a_worker_over_its_memory_limit_is_ended_and_counted_and_the_run_goes_on():
    """An allocation that grows without bound ends the worker at ``reward.worker_memory_mb`` (here 200 MB over what
    it inherited): the verifier's sample is a counted verifier error, a reward function's samples are counted in
    ``reward/<term>_errors``, and the next call runs in a fresh worker."""
    from support import reward_stage

    stage = RewardStage(HogTask(), [], 30.0, isolation="process", worker_memory_mb=200)
    g = Group(Problem("p", "q", "7"), [sample("7"), sample("hog"), sample("7")])
    t0 = time.monotonic()
    stage(g := [g], 0)
    assert time.monotonic() - t0 < 25
    assert [s.verifier_error for s in g[0].samples] == [False, True, False]
    assert [s.correct for s in g[0].samples] == [True, False, True]
    assert stage.verifier.restarts == 1
    stage.verifier.close()

    term = f"reward.terms=[{{name: python, function: '{__file__}:leaky', timeout_s: 30}}]"
    stage = reward_stage(HogTask(), [term, "reward.worker_memory_mb=200"])
    g = [Group(Problem("p", "q", "x"), [sample("a"), sample("hog"), sample("b")])]
    stage(g, 0)  # the batch call runs out; each sample alone: only the hog fails
    assert [s.reward for s in g[0].samples] == [1.0, 0.0, 1.0]
    assert stage.metrics() == {"reward/leaky_errors": 1.0}
    stage(g := [Group(Problem("p", "q", "x"), [sample("c")])], 1)
    assert g[0].samples[0].reward == 1.0


def test_a_run_gives_its_verifier_worker_the_configured_memory_limit(tmp_path):
    """``reward.worker_memory_mb`` reaches the verifier's worker of a built run, not only a Python reward term's."""
    from groupwise.config import load
    from groupwise.loop.setup import build

    cfg = load(None, ["model.warm_start=false", "reward.verifier_isolation=process", "reward.worker_memory_mb=123",
                      f"out_dir={tmp_path}"])
    pipe = build(cfg)
    assert pipe.reward.verifier.memory_mb == 123
    pipe.reward.verifier.close()


def test_the_memory_limit_is_what_the_worker_may_add_and_0_is_none():
    """The cap is the worker's address space at the fork plus ``memory_mb`` (a trainer's own size, CUDA's reserved
    ranges included, is not charged to the user's code); 0 leaves the limit as it was."""
    import resource

    w = Forked(lambda: resource.getrlimit(resource.RLIMIT_AS), 10.0, memory_mb=300)
    soft, hard = w()
    with open("/proc/self/statm") as f:
        here = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    assert soft == hard and abs(soft - (here + 300 * 2**20)) < 2**30
    w.close()
    free = Forked(lambda: resource.getrlimit(resource.RLIMIT_AS), 10.0, memory_mb=0)
    assert free() == resource.getrlimit(resource.RLIMIT_AS)
    free.close()


def test_worker_memory_mb_is_checked_and_documented():
    from groupwise.config import load

    assert load(None).reward.worker_memory_mb == 4096 == WORKER_MEMORY_MB  # the schema's default is Forked's
    assert load(None, ["reward.worker_memory_mb=0"]).reward.worker_memory_mb == 0
    with pytest.raises(ConfigError, match=r"worker_memory_mb=-1: allowed >= 0"):
        load(None, ["reward.worker_memory_mb=-1"])
    assert "reward.worker_memory_mb" in (ROOT / "docs" / "conventions.md").read_text()


def test_a_verifier_failure_from_memory_names_the_limit():
    w = Forked(hog, 30.0, "verifier", memory_mb=100)
    with pytest.raises(VerifierFailed, match=r"^MemoryError: .* over its memory limit \(reward.worker_memory_mb=100: "):
        w(Problem("p", "q", "7"), "hog")
    assert w(Problem("p", "q", "7"), "7") is True and w.restarts == 1
    w.close()


def private_mb(pid: int) -> float:
    """The pages only ``pid`` holds (its copies of pages the process it was forked from has since freed or written)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:")) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux's smaps_rollup")
def test_the_worker_is_forked_at_build_and_holds_none_of_the_trainers_later_memory():
    built = Forked(os.getpid, 10)  # forked here, before the trainer's big allocation
    # e.g. an eval's KV cache: its own mapping (as a large tensor's is), every page written, then unmapped. Not a
    # ``bytes``: a long suite's heap can serve one from free chunks that ``del`` keeps mapped, shared with the worker.
    big = written_mapping(300)
    late = Forked(os.getpid, 10)  # what a worker forked at its first call, inside that eval, would be
    try:
        assert built() == built._proc.pid != os.getpid() and late() == late._proc.pid
        big.close()  # the trainer frees its buffer; a worker forked while it was live keeps it as its own
        assert private_mb(late._proc.pid) > 250
        assert private_mb(built._proc.pid) < 50
    finally:
        built.close()
        late.close()
