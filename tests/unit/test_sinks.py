"""Metric sinks beside ``metrics.jsonl`` (``trainer.sinks``): Trackio logs to a local store, offline."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from groupwise.log import Logger
from groupwise.registry import ConfigError

ROOT = Path(__file__).parents[2]

# A run of the sink in its own process: trackio reads TRACKIO_DIR when it is imported.
LOG_AND_READ = textwrap.dedent("""
    import json, math, sys
    from groupwise.log import Logger
    logger = Logger(sys.argv[1], ("jsonl", "trackio"), {"seed": 3}, resume_step=None)
    logger.log(1, {"loss/total": 0.5, "eval/mean@4": 0.25, "mismatch/ess": math.nan})
    logger.log(2, {"loss/total": 0.125})
    logger.close()
    from trackio.sqlite_storage import SQLiteStorage
    print(json.dumps(SQLiteStorage.get_logs("groupwise", "run")))
""")


def test_trackio_sink_logs_every_step_locally(tmp_path):
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRACKIO_SPACE_ID", None)
    env.pop("TRACKIO_SERVER_URL", None)
    run = tmp_path / "run"
    run.mkdir()
    out = subprocess.run([sys.executable, "-c", LOG_AND_READ, str(run)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    logged = json.loads(out.stdout.strip().splitlines()[-1])
    got = [{k: v for k, v in row.items() if k != "timestamp"} for row in logged]
    assert got == [{"step": 1, "loss/total": 0.5, "eval/mean@4": 0.25}, {"step": 2, "loss/total": 0.125}]
    jsonl = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "time"} for r in jsonl] == got  # the same steps, NaN left out
    assert (tmp_path / "store" / "groupwise.db").is_file()


def test_trackio_not_installed_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)  # import trackio raises ImportError
    with pytest.raises(ConfigError) as e:
        Logger(tmp_path, ("jsonl", "trackio"), {}, resume_step=None)
    assert str(e.value) == "trainer.sinks: trackio is not installed; pip install groupwise[trackio]"
