"""experiments/harness.py's archive and restore: an experiment's results survive the loss of its machine (committed
under experiments/results/), its checkpoints and unfinished pieces left out."""

import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("harness", ROOT / "experiments" / "harness.py")
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)

KEPT = {"run-s0/summary.json": '{"after": {}}', "run-s0/metrics.jsonl": '{"step": 1}\n',
        "run-s0/resolved_config.yaml": "seed: 0\n", "final/run-s0.jsonl": '{"id": "a", "correct": true}\n',
        "logs/run-s0.log": "done\n"}
LEFT = {"run-s0/checkpoints/step_10/adapter.safetensors": "w", "run-s0/.lock": "1",
        "final/run-s1.chunk0.jsonl": "{}\n", "final/run-s1.chunk1.tmp": "{"}


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_archive_keeps_results_zips_records_and_leaves_weights_and_pieces(tmp_path):
    out, res = tmp_path / "out", tmp_path / "results"
    write(out, {**KEPT, **LEFT})
    written = harness.archive(out, res)
    names = sorted(str(p.relative_to(res)) for p in res.rglob("*") if p.is_file())
    assert names == ["final/run-s0.jsonl.gz", "logs/run-s0.log.gz", "run-s0/metrics.jsonl.gz",
                     "run-s0/resolved_config.yaml", "run-s0/summary.json"]
    assert sorted(written) == sorted(res / n for n in names)
    assert json.loads(gzip.decompress((res / "final/run-s0.jsonl.gz").read_bytes())) == {"id": "a", "correct": True}
    assert harness.archive(out, res) == []  # unchanged content: nothing rewritten (gzip without a timestamp)
    (out / "run-s0/metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert harness.archive(out, res) == [res / "run-s0/metrics.jsonl.gz"]


def test_restore_gives_back_what_was_archived_and_keeps_what_is_there(tmp_path):
    out, res, back = tmp_path / "out", tmp_path / "results", tmp_path / "back"
    write(out, {**KEPT, **LEFT})
    harness.archive(out, res)
    write(back, {"run-s0/summary.json": "newer"})
    written = harness.restore(res, back)
    assert {str(p.relative_to(back)) for p in written} == set(KEPT) - {"run-s0/summary.json"}
    assert (back / "run-s0/summary.json").read_text() == "newer"
    for rel in set(KEPT) - {"run-s0/summary.json"}:
        assert (back / rel).read_text() == KEPT[rel]
