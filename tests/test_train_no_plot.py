"""The job draws no plot: the Ray Train image has no matplotlib (tests/doubles/dlc_env.py), so rank 0's
finalize (export, metrics, summary) must not need it; the driver's run's end draws the plot
(evaluate.plot, tests/test_run_end_plot.py), and `raydlc submit`'s caller draws it where that end had none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc.evaluate import plot as lossplot

ROOT = Path(__file__).resolve().parents[1]

# The loop of one worker (gloo, world size 1, no Ray) to its last step and finalize, with matplotlib unimportable.
RUN_TO_THE_END = """
import sys
sys.modules["matplotlib"] = None  # as in the image: `import matplotlib` raises ImportError
import json, types
from pathlib import Path
import numpy as np, torch
from tests.test_train_cadence import Rows, Session, one_worker
from tests.test_train_step import world_of_one
from raydlc.data.tokenizer import for_model
from raydlc.train import loop as L
from raydlc.train.heartbeat import Quiet

out = Path(sys.argv[1])
info, _ = for_model("tiny", ["def f(x):\\n    return x + 1\\n" * 20] * 8, 300, has_own=False)
run = one_worker(steps=3, report_every=1, checkpoint_every=0)
run = run.model_validate({**run.model_dump(), "run_dir": str(out / "run-x"), "tokenizer": info.__dict__})
held = np.arange(100, 104)
ids, labels = Rows(16).take(held)
data = L.RankData(types.SimpleNamespace(n_train=96, documents=False), Rows(16), held, ids, labels)
with world_of_one():
    L._train(run, Session(), data, torch.device("cpu"), Quiet(), L.NoHooks())
print("matplotlib loaded:", any(m == "matplotlib" or m.startswith("matplotlib.") for m, v in sys.modules.items() if v is not None))
"""


def test_the_job_ends_with_its_export_and_metrics_where_matplotlib_cannot_be_imported(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", RUN_TO_THE_END, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "matplotlib loaded: False" in done.stdout
    run_dir = tmp_path / "run-x"
    assert (run_dir / "export" / "config.json").is_file() and (run_dir / "export" / "tokenizer.json").is_file()
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(line)] == [1, 2, 3]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
    assert not (run_dir / "loss.png").exists()  # the caller's to draw


def summary_of(run_dir: Path) -> dict:
    return {"metrics": str(run_dir / "metrics.jsonl"), "run_dir": str(run_dir), "model": "tiny", "workers": 1, "global_batch": 2, "seq_len": 16}


def write_metrics(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    rows = [{"step": s, "loss": 5.0 - s} for s in (1, 2, 3)] + [{"step": 3, "eval_loss": 2.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_caller_draws_the_plot_from_the_metrics_the_run_wrote(tmp_path: Path) -> None:
    write_metrics(tmp_path / "r")
    s = lossplot.with_plot(summary_of(tmp_path / "r"))
    assert s["plot"] == str(tmp_path / "r" / "loss.png") and s["plot_note"] is None
    data = (tmp_path / "r" / "loss.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_without_matplotlib_the_caller_skips_the_plot_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_metrics(tmp_path / "r")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec raises ValueError on None; lossplot must treat it as absent
    s = lossplot.with_plot(summary_of(tmp_path / "r"))
    assert s["plot"] is None and "matplotlib is not installed" in s["plot_note"] and not (tmp_path / "r" / "loss.png").exists()


def test_unreadable_metrics_skip_the_plot_with_a_note_naming_them(tmp_path: Path) -> None:
    s = lossplot.with_plot(summary_of(tmp_path / "nowhere"))
    assert s["plot"] is None and str(tmp_path / "nowhere" / "metrics.jsonl") in s["plot_note"]
