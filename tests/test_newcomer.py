"""What a newcomer reads (issue 44's first hour, issue 48's "the summary says what ran"): the summary at
80 columns with every path whole, phase text before the first step, the root cause first without
credentials, epochs and what LoRA trained, the layout in words, labelled throughput, help that
points at the docs, counts as lines, a plan header that tells what was asked from what is shown."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from raydlc.cli import main
from raydlc.views import progress
from raydlc.views.progress import PATH_ROWS, print_summary

GOLDEN = Path(__file__).parent / "golden" / "summary-80.txt"
RUN = "/home/someone/projects/finetune/raydlc-out/lora-on-my-base-2026-12-07T04-43-25"
SUMMARY: dict[str, Any] = {
    "steps": 100, "first_loss": 8.36, "final_loss": 5.05, "eval_loss": 5.31, "tokens_per_s": 1287.4, "step_time_s": 0.0995,
    "peak_mem_mb": 874.0, "peak_reserved_mb": None, "loss_drop": 0.396, "model": "tiny", "workers": 2, "sharding": "fsdp",
    "mesh": {"shape": [2]}, "global_batch": 16, "micro_batch": 8, "grad_accum": 1, "grad_sync": "every",
    "layout_note": "chosen without the planner (no known GPU type to plan with, as in a local run): the model sharded over every worker, no gradient accumulation",
    "seq_len": 128, "train_sequences": 176, "dataset": f"{RUN}/../datasets/bundled-tiny", "dataset_reused": True, "eval_sequences": 9,
    "epochs": 100 * 16 / 176, "resumed_from": None, "run_name": "lora-on-my-base", "run_dir": RUN,
    "checkpoint": f"{RUN}/checkpoint_000100", "export": f"{RUN}/export", "metrics": f"{RUN}/metrics.jsonl", "plot": f"{RUN}/loss.png",
    "wall_s": 61.2, "overfitting": "overfitting: eval loss rose over the last 3 evaluations (5.02 → 5.31; lowest 4.97 at step 60)",
    "lora": {"rank": 8, "alpha": 16.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
             "merged": True, "adapter": f"{RUN}/export/adapter"},
    "params": {"trainable": 202752, "total": 2574848},
}


def drawn(s: dict[str, Any], *, terminal: bool) -> str:
    buf = io.StringIO()
    print_summary(s, Console(file=buf, width=80, force_terminal=terminal, color_system=None, emoji=False, highlight=False))
    return buf.getvalue()


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_the_summary_at_80_columns_matches_its_golden_and_never_splits_a_path(terminal: bool) -> None:
    text = drawn(SUMMARY, terminal=terminal)
    assert text == GOLDEN.read_text()
    paths = [SUMMARY[k] if k != "adapter" else SUMMARY["lora"]["adapter"] for _, k in PATH_ROWS if (SUMMARY.get(k) or k == "adapter")]
    lines = text.splitlines()
    for p in paths:  # each path whole, alone on its line: copyable
        assert f"  {p}" in lines, p
    assert all(len(line) <= 80 for line in lines if line.strip() not in paths)
    assert "9.1 (100 steps x 16 sequences / 176 training sequences); WARNING" in " ".join(t.strip("│ ") for t in lines)


def test_the_summary_says_what_lora_trained_and_full_fine_tuning_says_so() -> None:
    flat = " ".join(line.strip("│ ") for line in drawn(SUMMARY, terminal=False).splitlines())
    assert "rank 8, alpha 16 on q_proj" in flat and "202.8K of 2.57M parameters trained (7.9%)" in flat
    assert "the export holds the merged weights" in flat
    full = {**SUMMARY, "lora": None, "params": {"trainable": 2574848, "total": 2574848}}
    flat = " ".join(line.strip("│ ") for line in drawn(full, terminal=False).splitlines())
    assert "off (full fine-tuning): 2.57M of 2.57M parameters trained (100.0%)" in flat and "LoRA adapter" not in flat
    saving = {**SUMMARY, "lora": {**SUMMARY["lora"], "modules_to_save": ["embed_tokens", "lm_head"]}}
    flat = " ".join(line.strip("│ ") for line in drawn(saving, terminal=False).splitlines())
    assert "(and embed_tokens, lm_head in full)" in flat
    few = {**SUMMARY, "epochs": 0.5, "steps": 10, "train_sequences": 320}
    assert "WARNING" not in drawn(few, terminal=False)


def test_the_summary_labels_the_mean_and_the_bar_the_last_step() -> None:
    assert "tokens/s (mean)" in drawn(SUMMARY, terminal=False)
    view = progress.TrainView(quiet=False, debug=False)
    view._start_bar(10, "starting 2 workers")
    try:
        columns = " ".join(getattr(c, "text_format", "") for c in view._bar.columns)
        assert "last step {task.fields[tps]} tok/s" in columns
    finally:
        view._bar.stop()


def test_phase_text_comes_before_the_first_step_then_the_bar_shows_epochs(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(progress, "err_console", Console(file=buf, width=100, force_terminal=True, color_system=None))
    shown = []
    with progress.TrainView(quiet=False, debug=False) as view:
        for rec in ({"stage": "preparing"}, {"stage": "phase", "text": "starting Ray"},
                    {"stage": "preparing", "records": 10, "tokens": 100, "elapsed_s": 1.0}, {"stage": "phase", "text": "preparing data"}):
            view(rec)
            shown.append(str(view._status.renderable.text))
        view({"stage": "training", "steps": 4, "workers": 2, "global_batch": 16, "train_sequences": 32})
        assert view._status is None  # the spinner gives way to the bar
        description = view._bar.tasks[0].description
        view({"step": 3, "loss": 2.5, "tokens_per_s": 651.0})
        task = view._bar.tasks[0]
    assert shown == ["preparing data and tokenizer…", "starting Ray…", "preparing data: 10 records (10/s), 100 tokens (100/s)", "preparing data…"]
    assert description == "starting 2 workers…" and task.description == "train"
    assert task.fields["epoch"] == "epoch 1.5  " and task.fields["tps"] == "651"


def test_off_a_terminal_the_phases_print_nothing_so_a_failure_stays_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(progress, "err_console", Console(file=buf, width=100, force_terminal=False))
    with progress.TrainView(quiet=False, debug=False) as view:
        view({"stage": "preparing"})
        view({"stage": "phase", "text": "starting Ray"})
    assert buf.getvalue() == ""


NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None, "AWS_PROFILE": None,
                  "AWS_CONFIG_FILE": "/nonexistent/config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
                  "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONTAINER_CREDENTIALS_FULL_URI": None,
                  "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": None, "AWS_WEB_IDENTITY_TOKEN_FILE": None}


@pytest.mark.parametrize("args", [["render"], ["render", "--zones", "us-east-2a,us-east-2b"], ["up", "--dry-run"], ["status"]],
                         ids=["render", "render-zones", "up-dry-run", "status"])
def test_without_credentials_the_root_cause_comes_first_with_what_still_works(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    for k in [k for k in __import__("os").environ if k.startswith("RAYDLC_")]:
        monkeypatch.delenv(k)
    for k, v in NO_CREDENTIALS.items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0].startswith("error: no AWS credentials found"), lines
    assert "GPU_AZ" not in lines[0] and "export RAYDLC_STORAGE_BUCKET" not in "\n".join(lines)
    assert len(lines) == 2 and lines[1].startswith("  hint: without credentials these still work:")
    assert "render --zones us-east-2a,us-east-2b" in lines[1] and "raydlc plan" in lines[1] and "raydlc train" in lines[1]


def test_the_render_the_hint_offers_works_without_credentials(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for k, v in NO_CREDENTIALS.items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    assert main(["--set", "STORAGE_BUCKET=team-runs", "render", "--zones", "us-east-2a,us-east-2b", "--out", "m"]) == 0
    assert (tmp_path / "m" / "raycluster.yaml").is_file()


def test_train_help_points_at_the_local_defaults_section_that_exists(capsys: pytest.CaptureFixture[str]) -> None:
    main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "docs/training.md#local-defaults" in out and "README: local defaults" not in out
    assert "\n## Local defaults\n" in (Path(__file__).parents[1] / "docs" / "training.md").read_text()


def test_data_show_prints_counts_as_lines_not_a_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.cli import train as cli_train

    buf = io.StringIO()
    monkeypatch.setattr(cli_train, "console", Console(file=buf, width=80, color_system=None))
    manifest = {"seq_len": 4, "source": {"spec": "chat.jsonl"}, "tokenizer": {"name": "bpe-4096"}, "chat_template": "model", "loss_on": "assistant",
                "counts": {"records_read": 400, "records_used": 398, "records_skipped": 2}}
    cli_train._print_dataset(SimpleNamespace(dest="ds", rows=10, tokens=40, loss_share=0.5, manifest=manifest, examples=[]))
    text = buf.getvalue()
    assert "{" not in text and "counts:\n  records read: 400\n  records used: 398\n  records skipped: 2\n" in text


def test_plan_says_what_was_asked_beside_what_its_figures_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "activation checkpointing: the planner's choice" in out  # asked: nothing, so not "off" nor "on"
    assert "figures below: micro-batch" in out and "(the planner's choice where not asked)" in out
    assert main(["plan", "--micro-batch", "2", "--grad-accum", "1", "--no-activation-checkpointing"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "asked: micro-batch 2, 1 accumulated, activation checkpointing off" in out
    assert "figures below: micro-batch 2, activation checkpointing off" in out


def test_the_local_layout_note_is_in_words_and_the_settings_stay_in_json() -> None:
    from raydlc.config import TrainConfig
    from raydlc.facts.models import get_spec
    from raydlc.train.layout import decide

    d = decide(TrainConfig(num_workers=2), [2], model=get_spec("tiny"), instance_type=None)
    assert "=auto" not in d.note and "SHARDING" not in d.note
    assert d.note.endswith("the model sharded over every worker, no gradient accumulation")


def test_a_short_run_is_evaluated_often_enough_to_see_overfitting() -> None:
    """Why `overfitting` stayed null on a 100-step laptop run: one checkpoint (CHECKPOINT_EVERY 100)
    meant one evaluation, and the note needs three rising in a row; EVAL_EVERY 0 now spreads ten."""
    from raydlc.config import TrainConfig
    from raydlc.train.cadence import Cadence
    from raydlc.train.metrics import summarize

    c = Cadence.of(TrainConfig(steps=100, checkpoint_every=100), gpu=False)
    evaluated = [s for s in range(1, 101) if c.due(s).validate]
    assert evaluated == list(range(10, 101, 10))
    c = Cadence.of(TrainConfig(steps=100, checkpoint_every=25), gpu=False)
    assert {25, 50, 75} <= {s for s in range(1, 101) if c.due(s).validate}  # every checkpoint still evaluated
    rising = [{"step": s, "eval_loss": 5.0 + (s - 60) / 100 if s > 60 else 5.0 - s / 100} for s in evaluated]
    steps = [{"step": s, "loss": 9.0 - s / 20, "tokens": 100, "step_time_s": 0.1, "peak_mem_mb": 1.0} for s in range(1, 101)]
    assert summarize(steps + rising)["overfitting"].startswith("overfitting: eval loss rose over the last 3 evaluations")


def test_epochs_and_the_trained_parameters_count_what_the_model_holds() -> None:
    import torch

    from raydlc.config import TrainConfig
    from raydlc.facts.models import get_spec
    from raydlc.train.launch import epochs, trained_params
    from raydlc.train.lora import apply_lora
    from raydlc.train.model import build_model

    assert epochs(100, 16, 176) == pytest.approx(9.0909, rel=1e-4) and epochs(None, 16, 176) is None and epochs(5, 16, 0) is None
    spec = get_spec("tiny")
    train = TrainConfig(lora_rank=4, lora_targets="q_proj,v_proj")
    out = trained_params(SimpleNamespace(train=train, run_dir="/r"), SimpleNamespace(model=spec))  # type: ignore[arg-type]
    model = build_model(spec, device="meta")
    apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=["q_proj", "v_proj"], seed=0)
    params = list(model.parameters())
    assert out["params"] == {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}
    assert out["lora"] == {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"], "merged": True, "adapter": "/r/export/adapter"}
    full = trained_params(SimpleNamespace(train=TrainConfig(), run_dir="/r"), SimpleNamespace(model=spec))  # type: ignore[arg-type]
    assert full["lora"] is None and full["params"]["trainable"] == full["params"]["total"] == sum(
        p.numel() for p in build_model(spec, device="meta").parameters()) and torch is not None


API_WRONG_TYPES = [
    ("settings", "train", {"settings": "LORA_RANK=8"}),
    ("config", "train", {"config": 123}),
    ("on_progress", "train", {"on_progress": "x"}),
    ("address", "train", {"address": 123}),
    ("lora_rank", "train", {"lora_rank": True}),  # a bool is not a rank (pydantic would read 1)
    ("source", "data_prepare", {"source": 123}),
    ("dest", "data_show", {"dest": None}),
    ("out", "render", {"out": 123}),
    ("config", "plan", {"config": 123}),
]


@pytest.mark.parametrize("name, use_case, kwargs", API_WRONG_TYPES, ids=[f"{u}-{n}" for n, u, _ in API_WRONG_TYPES])
def test_the_api_refuses_a_wrong_type_as_raydlcs_input_error_naming_the_argument(name: str, use_case: str, kwargs: dict[str, Any]) -> None:
    import sys

    import raydlc.api as api
    from raydlc.errors import InputError

    ray_before = "ray" in sys.modules
    with pytest.raises(InputError) as e:
        getattr(api, use_case)(**kwargs)
    assert e.value.message.startswith(f"{name}: must be ")
    assert ("ray" in sys.modules) == ray_before  # refused before anything started


def test_render_sets_the_rayjobs_deadline_from_the_budget_at_the_price_set() -> None:
    """$5 at GPU_USD_PER_HOUR=3 on two nodes is 3,000 s, not the list price's 1,955 s."""
    import raydlc.api as api

    def deadline(**extra: str) -> int:
        r = api.render(only="rayjob", zones="us-east-2a,us-east-2b",
                       settings={"STORAGE_PATH": "s3://team-runs/r", "JOB_MAX_COST_USD": "5", **extra})
        (doc,) = r.docs.values()
        return int(doc["spec"]["activeDeadlineSeconds"])

    assert deadline(GPU_USD_PER_HOUR="3") == 3000
    assert deadline() == 1955  # no price set: the On-Demand list price of 2 x g6.12xlarge


def test_a_full_disk_without_a_file_name_names_where_it_was_writing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    """A file's write() raises ENOSPC with no file name: the line names the --out folder, not '(unnamed file)'."""
    import errno

    from raydlc.cli import train as cli_train

    def full(*args: Any, **kw: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cli_train.data_use_case, "data_prepare", full)
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", "chat.jsonl", "--out", "prepared", "--json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: writing under {tmp_path / 'prepared'}: no space left on device"), err
    assert "unnamed file" not in err
