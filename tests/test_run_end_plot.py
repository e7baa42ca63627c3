"""The loss plot as the run's end's first step (train.ending): drawn from the run's metrics.jsonl before the card,
which carries a copy (`export/loss.png`, referenced relatively), and before the trackers' close, which logs it.
No Ray: `ending.finish` on a real RunSpec and summary over a run directory, as `train.launch.run` calls it;
the card read back by huggingface_hub's parser, TensorBoard's images by its EventAccumulator."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from tests.test_evaluate_card import run_spec, summary
from tests.test_tracking import accumulated

from raydlc.train import ending
from raydlc.train.tracking import end_files

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_plot_is_the_first_step_of_the_runs_end() -> None:
    assert [name for name, _ in ending.STEPS] == ["loss plot", "evaluation", "model card", "trackers"]


def test_the_card_embeds_the_plot_drawn_first_and_keeps_the_loss_table(tmp_path: Path) -> None:
    run = tmp_path / "run-x"
    out = ending.finish(run_spec(run), summary(run))
    assert "end_warnings" not in out, out.get("end_warnings")
    assert out["plot"] == str(run / "loss.png") and out["plot_note"] is None
    drawn = (run / "loss.png").read_bytes()
    assert drawn[:8] == PNG and len(drawn) > 5000
    assert (run / "export" / "loss.png").read_bytes() == drawn  # the export uploaded on its own keeps its picture
    text = ModelCard.load(run / "export" / "README.md").text
    assert "![training loss](loss.png)" in text and str(run) not in text.split("## Evaluation")[0]  # relative, not the run's path
    assert "| 20 | 0.0000 | 4.2000 |" in text  # the loss table as text too


def test_without_matplotlib_the_plot_is_a_note_and_the_card_still_comes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as in the cluster image: `import matplotlib` fails
    run = tmp_path / "run-x"
    out = ending.finish(run_spec(run), summary(run))
    assert "end_warnings" not in out, out.get("end_warnings")
    assert out["plot"] is None and "matplotlib is not installed" in out["plot_note"]
    assert not (run / "loss.png").exists() and not (run / "export" / "loss.png").exists()
    text = (run / "export" / "README.md").read_text()
    assert out["model_card"] == str(run / "export" / "README.md") and "![training loss]" not in text and "| 20 | 0.0000 | 4.2000 |" in text


def test_the_trackers_close_logs_the_plot(tmp_path: Path) -> None:
    run = tmp_path / "run-x"
    out = ending.finish(run_spec(run, tracking="tensorboard"), summary(run))
    assert "end_warnings" not in out and "trackers_stopped" not in out, out
    acc = accumulated(run / "tb")
    assert "loss" in acc.Tags()["images"]  # TensorBoard's artifact for a PNG: the image itself
    image = acc.Images("loss")[-1]
    assert image.encoded_image_string[:8] == PNG and (image.width, image.height) == (700, 400)  # 7 x 4 in at 100 dpi


def test_a_plot_in_object_storage_is_fetched_for_the_trackers(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "loss.png").write_bytes(PNG + b"plot")
    (tmp_path / "tmp").mkdir()
    files = end_files({"plot": f"file://{tmp_path}/store/loss.png"}, tmp_path / "tmp")  # a URI: read through edges.storage (pyarrow)
    assert [f.name for f in files] == ["summary.json", "loss.png"] and files[1].read_bytes() == PNG + b"plot"
    files = end_files({"plot": f"file://{tmp_path}/store/gone.png"}, tmp_path / "tmp")
    assert [f.name for f in files] == ["summary.json"]  # unreadable: nothing to log, and no failure


def test_a_run_dir_in_object_storage_gets_its_plot_beside_the_metrics_and_in_the_card(tmp_path: Path) -> None:
    run = tmp_path / "run-x"
    s = summary(run)
    uri = f"file://{run}"
    out = ending.finish(run_spec(run).model_copy(update={"run_dir": uri}), {**s, "run_dir": uri, "metrics": f"{uri}/metrics.jsonl",
                                                                                "export": f"{uri}/export"})
    assert "end_warnings" not in out, out.get("end_warnings")
    assert out["plot"] == f"{uri}/loss.png" and (run / "loss.png").read_bytes()[:8] == PNG  # drawn locally, published beside the metrics
    assert (run / "export" / "loss.png").read_bytes() == (run / "loss.png").read_bytes()
    assert "![training loss](loss.png)" in (run / "export" / "README.md").read_text()
