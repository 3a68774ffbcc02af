"""Rollout shards and Ray rollout workers (``loop/workers.py``): one shard keeps today's seeds; at the same
``rollout.shards`` the samples and metrics are bit-identical in this process and on 1 or 2 Ray workers, over
steps with weight syncs; a worker killed mid-shard is restarted, its shard rerun, the event counted; a resumed
run with workers equals a resumed run without; components that cannot run in a worker are refused."""

import sys
import textwrap

import pytest

from groupwise.config import load
from groupwise.loop import workers
from groupwise.loop.setup import build
from groupwise.loop.sync_check import StaleEngineError
from groupwise.loop.trainer import lagged_step, rl_step, train
from groupwise.loop.workers import deal, interleave
from groupwise.registry import ConfigError
from groupwise.seeding import stable_seed

ARGS = ["model.warm_start=false", "trainer.threads=1", "trainer.record_groups=0", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_completion_tokens=12", "optim.lr=1e-2",
        "reward.terms=[{name: length_penalty, max_length: 12}]"]  # lengths vary: every step moves the weights
STEPS = 3


@pytest.fixture(scope="module")
def pool():
    """One Ray instance for the module (None without ray); its actors start while the in-process runs go on,
    and every run takes them over (a fresh actor costs a process start and the torch imports)."""
    try:
        import ray
    except ImportError:
        yield None
        return
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    workers.prestart(2)
    yield ray
    ray.shutdown()


@pytest.fixture()
def ray_session(pool):
    if pool is None:
        pytest.skip("ray is not installed (pip install 'groupwise[ray]')")
    return pool


def run(tmp_path, *overrides: str, steps: int = STEPS):
    """Steps of a fresh pipeline: (each step's groups as the filter saw them, each step's metrics, seeds)."""
    p = build(load(None, [*ARGS, f"out_dir={tmp_path}", *overrides]), io=False)
    seen: list = []
    inner = p.filter
    p.filter = lambda groups, n, make: (seen.append(groups), inner(groups, n, make))[1]
    seeds: list[int] = []
    generate = p.generator.generate  # the run's generations (the sync check's probes go to the engine directly)
    p.generator.generate = lambda reqs, params, rng: (seeds.append(rng.initial_seed()), generate(reqs, params, rng))[1]
    try:
        metrics = [rl_step(p, s) for s in range(steps)]
    finally:
        p.shards.close()
    return seen, metrics, seeds


def samples(seen) -> list:
    return [(g.problem.id, s.completion_ids.tolist(), s.rollout_logprobs.numpy().tobytes(), s.reward)
            for groups in seen for g in groups for s in g.samples]


def comparable(metrics: list[dict[str, float]], skip: tuple[str, ...] = ()) -> list[dict[str, float]]:
    """Everything but wall-clock timings, the worker-only restart count, the sync probe's gap (with workers it
    also covers the workers' probes, in their own processes) and the keys in ``skip``."""
    drop = ("rollout/worker_restarts", "sync/probe_dlogp", *skip)
    return [{k: v for k, v in m.items() if not k.startswith("perf/") or k in ("perf/gen_tokens", "perf/prompt_tokens")}
            for m in ({k: v for k, v in m.items() if k not in drop} for m in metrics)]


@pytest.fixture(scope="module")
def in_process(pool, tmp_path_factory):
    return run(tmp_path_factory.mktemp("ref"), "rollout.shards=2")


def test_one_shard_keeps_todays_seeds(in_process, tmp_path):
    _, metrics, seeds = run(tmp_path, steps=1)
    assert seeds == [stable_seed(0, 0, "rollout", 0)], "one shard: no shard index, the seeds of a run before shards"
    assert in_process[2] == [stable_seed(0, s, "rollout", 0, i) for s in range(STEPS) for i in range(2)]
    assert "rollout/worker_restarts" not in metrics[0], "in-process runs log what they logged before"


def test_deal_and_interleave_are_inverse():
    items = list(range(7))
    assert deal(items, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert interleave(deal(items, 3)) == items and interleave(deal(items, 1)) == items


@pytest.mark.parametrize("workers", [2, 1])  # 2 first: both actors start at once
def test_workers_equal_in_process(ray_session, in_process, tmp_path, workers):
    seen, metrics, _ = run(tmp_path, "rollout.shards=2", f"rollout.workers={workers}")
    ref_seen, ref_metrics, _ = in_process
    assert sum(m["update/grad_norm"] > 0 for m in ref_metrics[:-1]) >= 1, "the weights moved: a sync was needed"
    assert samples(seen) == samples(ref_seen)
    assert comparable(metrics) == comparable(ref_metrics)
    assert [m["rollout/worker_restarts"] for m in metrics] == [0.0] * STEPS


def test_workers_run_lagged_and_equal_in_process(ray_session, tmp_path):
    """Asynchronous rollouts (K = 1) with Ray workers: the actors are given the snapshot's weights (``Lag.at``), so
    the run equals the same lagged run with its shards in this process, sample for sample."""
    def lagged(out, *overrides):
        p = build(load(None, [*ARGS, f"out_dir={out}", "rollout.shards=2", "rollout.max_async_level=1",
                              f"trainer.steps={STEPS}", *overrides]), io=False)
        assert p.lag is not None
        try:
            return [lagged_step(p, s) for s in range(STEPS)]
        finally:
            p.shards.close()

    ref, got = lagged(tmp_path / "in", "rollout.workers=0"), lagged(tmp_path / "ray", "rollout.workers=2")
    assert [m["rollout/staleness_max"] for m in got] == [0.0, 1.0, 1.0]
    assert sum(m["update/grad_norm"] > 0 for m in ref[:-1]) >= 1, "the weights moved: the snapshot changed"
    # the sampler's log-probs of the first step differ in their last bits between the snapshot's generator here
    # and a worker's (mismatch/kl 4.7e-14 against 4.9e-14); tokens, rewards and every other metric are equal
    mismatch = ("mismatch/kl", "mismatch/is_weight_mean", "mismatch/ess")
    assert comparable(got, mismatch) == comparable(ref, mismatch)
    for m, r in zip(got, ref):  # (a step whose rows were all inert logs no mismatch)
        assert m.keys() & set(mismatch) == r.keys() & set(mismatch)
        assert all(m[k] == pytest.approx(r[k], abs=1e-6) for k in m.keys() & set(mismatch))


DIE_ONCE = '''
import dataclasses, os
from groupwise.rollout import BUILDERS

@dataclasses.dataclass(frozen=True, kw_only=True)
class DieOnceConfig:
    marker: str = ""
    step: int = 1

@BUILDERS.register("die_once", config=DieOnceConfig)
def die_once(cfg, env):
    def build(problems, ctx):  # the standard builder, except that one process dies once, mid-shard
        if ctx.step == cfg.step:
            try:  # created atomically: of two shards running at once, only one dies (a check-then-touch let both)
                os.close(os.open(cfg.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        return ctx.sample_groups(problems)
    return build
'''


def test_killed_worker_is_restarted_and_its_shard_retried(ray_session, in_process, tmp_path):
    plugin = tmp_path / "die_once.py"
    plugin.write_text(textwrap.dedent(DIE_ONCE))
    seen, metrics, _ = run(tmp_path, "rollout.shards=2", "rollout.workers=2", f"plugins=[{plugin}]",
                           f"rollout.builder={{name: die_once, marker: {tmp_path / 'died'}}}")
    assert (tmp_path / "died").exists(), "a worker died mid-shard"
    assert [m["rollout/worker_restarts"] for m in metrics] == [0.0, 1.0, 0.0]
    assert samples(seen) == samples(in_process[0]), "the retried shard drew what the undisturbed run drew"
    assert comparable(metrics) == comparable(in_process[1])


RAISES = '''
from groupwise.registry import NoConfig
from groupwise.rollout import BUILDERS

@BUILDERS.register("raises_at_step_1", config=NoConfig)
def raises_at_step_1(cfg, env):
    def build(problems, ctx):
        if ctx.step == 1:
            raise ValueError("no groups at step 1")
        return ctx.sample_groups(problems)
    return build
'''


def test_a_plugin_that_raises_in_a_worker_is_the_same_one_line_as_in_process(tmp_path):
    """Issue 48: a plug-in that raised inside a Ray worker ended the run with Ray's remote traceback (~25 lines)
    in the ``error:`` line, where in process it is one line naming the plug-in. Two workers, so that both shards
    raise: the one whose error is not fetched must not print Ray's "Unhandled error" traceback either."""
    pytest.importorskip("ray")
    plugin = tmp_path / "raises.py"
    plugin.write_text(textwrap.dedent(RAISES))
    said = {}
    for n in (0, 2):
        proc = cli_train(tmp_path / f"w{n}", f"plugins=[{plugin}]", "rollout.builder=raises_at_step_1",
                         "rollout.shards=2", f"rollout.workers={n}", "trainer.steps=3")
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and "Traceback" not in err and "Unhandled error" not in err, err[-3000:]
        said[n] = [line for line in err.splitlines() if line.strip()]
    assert said[0][-1].startswith("error: group builder plug-in 'raises_at_step_1' (")
    assert said[0][-1].endswith("raised ValueError: no groups at step 1 (line 9)"), said[0]
    assert said[2][-1] == said[0][-1], said[2][-5:]


def test_workers_that_keep_old_weights_are_noticed(ray_session, in_process, tmp_path, monkeypatch):
    """The driver's sync silently sends nothing: each actor keeps the weights it first loaded. Its probe (its
    generator after its last load) is compared with the driver's policy when its shard comes back."""
    monkeypatch.setattr(workers.RayWorkers, "sync_weights", lambda self, policy: None)
    with pytest.raises(StaleEngineError, match=r"^rollout\.sync_check: rollout worker \d \(pid \d+\) does not hold"):
        run(tmp_path / "error", "rollout.shards=2", "rollout.workers=2", "rollout.sync_check=error")
    seen, metrics, _ = run(tmp_path / "resync", "rollout.shards=2", "rollout.workers=2")  # resync: the default
    failures = [m["sync/failures"] for m in metrics]
    assert failures[0] == 0 and sum(failures) >= 2, failures  # a stale shard each after the first update
    assert samples(seen) == samples(in_process[0]), "every stale shard was rerun on the driver's weights"
    assert comparable(metrics, ("sync/failures",)) == comparable(in_process[1], ("sync/failures",))


def test_resume_with_workers_equals_resume_in_process(ray_session, tmp_path):
    common = [*ARGS, "rollout.shards=2", "trainer.save_every=1", "trainer.progress=false", "trainer.sinks=[jsonl]",
              "eval.before=false", "eval.after=false", "seed=1"]  # seed 0's second step ties every group
    train(load(None, [*common, f"out_dir={tmp_path}/a", "trainer.steps=1"]))
    train(load(None, [*common, f"out_dir={tmp_path}/b", "trainer.steps=1"]))
    a = train(load(None, [*common, f"out_dir={tmp_path}/a", "trainer.steps=2"]), resume=True)["last"]
    b = train(load(None, [*common, f"out_dir={tmp_path}/b", "trainer.steps=2", "rollout.workers=2"]),
              resume=True)["last"]
    assert comparable([b]) == comparable([a]) and a["update/grad_norm"] > 0


@pytest.mark.parametrize(("overrides", "message"), [
    (["rollout.workers=3", "rollout.shards=2"], "workers=3: allowed 0 or at most rollout.shards (2)"),
    (["rollout.workers=1", "reward.terms=[acoer]"], "reward.terms.0: reward 'acoer' keeps checkpointed state"),
    (["rollout.workers=1", "reward.terms=[{name: python, function: math:floor}]"], "reports metrics"),
    (["rollout.workers=1", "task.modes=true", "rollout.builder=think_modes"],
     "rollout.builder: group builder 'think_modes' reports"),
    (["rollout.workers=1", "rollout.generator=fake"],
     "rollout.generator: generator 'fake' must run in the training process"),
])
def test_what_cannot_run_in_a_worker_is_refused_at_load(overrides, message):
    pytest.importorskip("ray")
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"rollout.workers=1 needs ray, which is not installed: "
                                          r"pip install 'groupwise\[ray\]'$"):
        load(None, ["rollout.workers=1"])


def test_sigterm_on_a_run_with_workers_stops_after_the_step_and_saves(tmp_path):
    """Issue 31: ray.init replaced the session's SIGTERM handler, so SIGTERM on a Ray run exited 15 at once
    with nothing saved (SIGINT was fine)."""
    import json
    import signal

    pytest.importorskip("ray")
    proc, log = running_with_a_worker(tmp_path, "trainer.save_every=0", GROUPWISE_CACHE=str(tmp_path / "cache"))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert "interrupted: saved step" in out + err, (proc.returncode, out[-1000:], err[-2000:])
    step = max(json.loads(x)["step"] for x in log.read_text().splitlines())
    assert (tmp_path / "r" / "checkpoints" / f"step_{step:07d}").is_dir()


def test_a_killed_ray_node_stops_the_run_in_one_line(tmp_path):
    """Issue 31: with the raylet killed, a run with workers ended with exit 1 and no message of its own (Ray's core
    worker ended the process), or with a traceback through the shard loop. Now a line says the Ray node died and
    which checkpoint the run keeps, either way."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    pytest.importorskip("ray")
    proc, _ = running_with_a_worker(tmp_path, "trainer.save_every=1")
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and Path(f"/proc/{p}/stat").exists()]
    raylet = []
    for pid in children:
        try:
            stat, cmdline = Path(f"/proc/{pid}/stat").read_text(), Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid and b"raylet" in cmdline.split(b"\0")[0]:
            raylet.append(pid)
    assert len(raylet) == 1, raylet
    os.kill(raylet[0], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("no exit within 120 s of the raylet's death") from None
    assert proc.returncode != 0 and "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if "rollout.workers:" in line and "the Ray node died" in line]
    assert said and "resume with --resume" in said[0], err[-3000:]
    assert any((tmp_path / "r" / "checkpoints").glob("step_*")), "save_every=1: a checkpoint is kept"


def cli_train(tmp_path, *overrides: str, **env: str):
    """``groupwise train`` with one Ray worker (unless ``overrides`` say otherwise), started in a subprocess; its
    run directory is ``tmp_path / "r"``."""
    import os
    import subprocess
    from pathlib import Path

    src = str(Path(__file__).parents[3] / "src")
    env = {**os.environ, **env, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\n")
    cmd = [sys.executable, "-m", "groupwise.cli", "train", str(recipe), *ARGS, "rollout.shards=1", "rollout.workers=1",
           "trainer.steps=200", "trainer.progress=false", "trainer.sinks=[jsonl]", "eval.before=false",
           "eval.after=false", f"out_dir={tmp_path}", *overrides]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def running_with_a_worker(tmp_path, *overrides: str, **env: str):
    """``cli_train``, once it has logged two steps: (process, metrics file)."""
    import time

    proc = cli_train(tmp_path, *overrides, **env)
    log, deadline = tmp_path / "r" / "metrics.jsonl", time.time() + 240
    while proc.poll() is None and time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    return proc, log
