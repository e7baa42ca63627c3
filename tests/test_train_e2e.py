"""End-to-end runs under a real local Ray (one in-process instance for the whole module).

The tiny model on the bundled corpus, a handful of steps of 32 tokens, so the comparisons are
exact-arithmetic questions (same losses, same data order) rather than quality ones.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raydlc.cli import main
from raydlc.config import TrainConfig
from raydlc.data.corpus import bundled_corpus
from raydlc.train import metrics as M
from raydlc.train.faults import Crash
from raydlc.train.launch import run
from raydlc.train.runspec import RunTarget

pytestmark = pytest.mark.slow

STEPS = 6
BASE = TrainConfig(model_id="tiny", steps=STEPS, seq_len=32, batch_size=2, num_workers=2, learning_rate=2e-3, checkpoint_every=2)
QUIET = RunTarget(log_to_driver=False)


@pytest.fixture(scope="module")
def local_ray(ray_local: Any) -> Iterator[None]:
    """The session's one in-process Ray (tests/conftest.py), shared with the plan/preflight tests."""
    yield


def losses(summary: dict[str, Any]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in M.read_jsonl(Path(summary["metrics"])) if "loss" in r}


def fingerprints(summary: dict[str, Any]) -> dict[int, str]:
    return {r["step"]: r["data"] for r in M.read_jsonl(Path(summary["metrics"])) if "loss" in r}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A slice of the bundled corpus as a user .txt file: the same prose, a faster tokenizer fit."""
    path = tmp_path_factory.mktemp("data") / "docstrings.txt"
    path.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=150_000)))
    return str(path)


@pytest.fixture(scope="module")
def base(corpus: str) -> TrainConfig:
    return BASE.updated(data=corpus)


@pytest.fixture(scope="module")
def two_workers(local_ray: None, base: TrainConfig, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(base.updated(storage_path=str(tmp_path_factory.mktemp("two"))), QUIET)


def assert_close(a: dict[int, float], b: dict[int, float], tol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    worst = max(abs(a[s] - b[s]) for s in a)
    assert worst <= tol, f"max |Δloss| {worst:.3g} > {tol}: {a} vs {b}"


def test_run_writes_checkpoints_metrics_plot_and_a_loadable_export(two_workers: dict[str, Any], base: TrainConfig) -> None:
    s = two_workers
    assert s["steps"] == STEPS and s["eval_loss"] is not None and s["tokens_per_s"] > 0
    assert s["final_loss"] < s["first_loss"]
    # The summary came through Ray (the metrics of the last checkpoint); the files agree with it.
    from_file = M.summarize(M.read_jsonl(Path(s["metrics"])))
    assert {k: s[k] for k in from_file} == from_file
    seen = json.loads((Path(s["run_dir"]) / "run.json").read_text())  # the RunSpec as rank 0 validated it
    # ... with what the driver decided made concrete: the GPUs, when gradients sync (one micro-batch: every), no checkpointing (empty: off locally), no compile on CPUs, fp32 reduction (auto without a plan).
    decided = base.updated(storage_path=seen["train"]["storage_path"], use_gpu=False, grad_sync="every", activation_checkpointing=False, compile=False,
                           reduce_dtype="fp32")
    assert seen["train"] == json.loads(decided.model_dump_json())
    assert (seen["mesh"]["sharding"], seen["use_gpu"], seen["bf16"]) == ("fsdp", False, False)
    assert Path(s["checkpoint"]).name == "checkpoint_000006"
    run_dir = Path(s["run_dir"])
    # CHECKPOINT_KEEP=2 (the default): Ray deleted step 2's once step 6's was registered.
    assert sorted(p.name for p in run_dir.glob("checkpoint_*") if p.is_dir()) == ["checkpoint_000004", "checkpoint_000006"]
    # The run's end drew the loss plot first (matplotlib is here), and the card carries its copy, referenced relatively.
    assert s["plot"] == str(run_dir / "loss.png") and s["plot_note"] is None and Path(s["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "export" / "loss.png").read_bytes() == Path(s["plot"]).read_bytes()
    assert "![training loss](loss.png)" in (run_dir / "export" / "README.md").read_text()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(s["export"])
    tok = AutoTokenizer.from_pretrained(s["export"])
    assert model.config.num_hidden_layers == 4 and model.config.vocab_size == 4096
    prompt = tok("Return the", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    assert isinstance(tok.decode(out[0]), str) and tok.decode(out[0]).startswith("Return the")


def test_one_worker_and_two_workers_take_the_same_steps(two_workers: dict[str, Any], base: TrainConfig, tmp_path: Path) -> None:
    one = run(base.updated(num_workers=1, batch_size=4, storage_path=str(tmp_path)), QUIET)
    assert one["global_batch"] == two_workers["global_batch"] == 4
    assert_close(losses(one), losses(two_workers))
    assert fingerprints(one) == fingerprints(two_workers)


def test_hsdp_two_replicas_with_accumulation_matches_fsdp(two_workers: dict[str, Any], base: TrainConfig, tmp_path: Path) -> None:
    """The whole product path (config, driver decision, RunSpec, the loop's micro-batches and FSDP2's
    switches): HSDP, 2 accumulated micro-batches of 1, against FSDP with one micro-batch of 2."""
    hsdp = run(base.updated(sharding="hsdp", hsdp_replicas=2, batch_size=1, grad_accum=2, storage_path=str(tmp_path)), QUIET)
    assert hsdp["sharding"] == "hsdp"
    assert (hsdp["micro_batch"], hsdp["grad_accum"], hsdp["grad_sync"], hsdp["global_batch"]) == (1, 2, "all-reduce-once", 4)
    assert (two_workers["micro_batch"], two_workers["grad_accum"], two_workers["global_batch"]) == (2, 1, 4)
    # The driver's plan and the mesh the workers built agree: 2 replicas of 1 rank, not (1, 2).
    assert hsdp["mesh"] == {"shape": [2, 1], "replicas": 2, "shard": 1, "ranks_per_node": [2], "built": [2, 1]}
    assert two_workers["mesh"] == {"shape": [2], "replicas": 1, "shard": 2, "ranks_per_node": [2], "built": [2]}
    assert_close(losses(hsdp), losses(two_workers))
    assert fingerprints(hsdp) == fingerprints(two_workers)
    assert json.loads((Path(hsdp["run_dir"]) / "run.json").read_text())["train"]["grad_accum"] == 2


def test_a_killed_worker_is_restarted_from_the_checkpoint_and_ends_the_same(two_workers: dict[str, Any], base: TrainConfig, tmp_path: Path) -> None:
    crashed = run(base.updated(storage_path=str(tmp_path), max_failures=1), RunTarget(log_to_driver=False, faults=Crash(rank=1, step=6)))
    progress = M.read_jsonl(Path(crashed["run_dir"]) / "progress.jsonl")
    # The restart resumed from a checkpoint the first attempt saved (step 2 or 4: saves are
    # asynchronous, step 2's is reported by step 4's save at the latest and step 4's once its write
    # is done, and whether Ray had registered step 4's before rank 1 died is a race), and every
    # step after it ran again.
    (resumed,) = [r["step"] for r in progress if r.get("resumed")]
    assert resumed in (2, 4)
    at = next(i for i, r in enumerate(progress) if r.get("resumed"))
    assert progress[at]["node"]  # the record names where the run came back
    after = [r["step"] for r in progress[at:] if "loss" in r]
    assert after == list(range(resumed + 1, STEPS + 1))
    assert crashed["final_loss"] == pytest.approx(two_workers["final_loss"], abs=1e-5)
    assert_close(losses(crashed), losses(two_workers))


def cli_train(args: list[str], capsys: pytest.CaptureFixture[str], root: tuple[str, ...] = ()) -> dict[str, Any]:
    common = ["train", "--model", "tiny", "--seq-len", "32", "--batch-size", "2", "--workers", "2", "--lr", "2e-3", "--checkpoint-every", "2", "--json"]
    assert main([*root, *common, *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_resume_continues_from_the_last_checkpoint_with_the_same_data_order(
    two_workers: dict[str, Any], corpus: str, tmp_path: Path, clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An earlier run that stopped after its step-4 checkpoint: the uninterrupted run's own files.
    earlier = tmp_path / "out" / "run-20260101-000000-000000" / "checkpoint_000004"
    shutil.copytree(Path(two_workers["run_dir"]) / "checkpoint_000004", earlier)
    resumed = cli_train(["--data", corpus, "--steps", str(STEPS), "--out", str(tmp_path / "out"), "--resume"], capsys, root=("--set", "REPORT_EVERY=3"))
    assert resumed["resumed_from"] == str(earlier)
    assert json.loads((Path(resumed["run_dir"]) / "run.json").read_text())["train"]["report_every"] == 3  # --set reached the workers
    assert {"steps", "first_loss", "final_loss", "eval_loss", "tokens_per_s", "checkpoint", "export", "plot"} <= set(resumed)
    assert_close(losses(resumed), losses(two_workers))  # steps 1-4 came along in the checkpoint
    assert fingerprints(resumed) == fingerprints(two_workers)
    progress = M.read_jsonl(Path(resumed["run_dir"]) / "progress.jsonl")
    assert [(r["step"], bool(r["node"])) for r in progress if r.get("resumed")] == [(4, True)]
    assert [r["step"] for r in progress if "loss" in r] == [5, 6]  # only the remaining steps ran


def test_resume_from_uri_storage_lists_downloads_and_continues(two_workers: dict[str, Any], base: TrainConfig, tmp_path: Path) -> None:
    """STORAGE_PATH as a URI: --resume lists it, the driver checks the manifest and sizes, each worker
    downloads and verifies the checkpoint; metrics and summary come back without a local path."""
    store = tmp_path / "store"
    shutil.copytree(Path(two_workers["run_dir"]) / "checkpoint_000004", store / "run-20260101-000000-000000" / "checkpoint_000004")
    uri = f"file://{store}"
    resumed = run(base.updated(storage_path=uri, resume=True), QUIET)
    assert resumed["resumed_from"] == f"{uri}/run-20260101-000000-000000/checkpoint_000004"
    assert resumed["run_dir"].startswith(uri + "/") and resumed["final_loss"] == pytest.approx(two_workers["final_loss"], abs=1e-5)
    local_run = store / resumed["run_name"]
    assert_close(losses({"metrics": str(local_run / "metrics.jsonl")}), losses(two_workers))
    assert not (local_run / "progress.jsonl").exists()  # a URI run dir: the driver keeps no local copy


def test_resume_refuses_a_corrupt_checkpoint_and_other_data_before_workers_start(
    two_workers: dict[str, Any], corpus: str, tmp_path: Path, clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "out" / "run-20260101-000000-000000" / "checkpoint_000004"
    shutil.copytree(Path(two_workers["run_dir"]) / "checkpoint_000004", bad)
    (bad / "__1_0.distcp").write_bytes(b"")
    common = ["train", "--model", "tiny", "--seq-len", "32", "--batch-size", "2", "--workers", "2", "--data", corpus]
    assert main([*common, "--out", str(tmp_path / "out"), "--resume"]) == 1
    err = capsys.readouterr().err
    assert "corrupt" in err and "__1_0.distcp" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["run-20260101-000000-000000"]  # no new run
    good = Path(two_workers["run_dir"]) / "checkpoint_000004"
    other = tmp_path / "other.txt"
    other.write_text(Path(corpus).read_text()[::-1])
    assert main(["train", "--model", "tiny", "--seq-len", "32", "--batch-size", "2", "--workers", "2", "--data", str(other), "--resume-from", str(good)]) == 1
    assert "different run" in capsys.readouterr().err


def test_bf16_with_activation_checkpointing_trains_tears_down_and_exports(base: TrainConfig, local_ray: None, tmp_path: Path) -> None:
    # No warm-up: 3 steps inside the default 20 of it move the weights too little for the loss to fall reliably.
    s = run(base.updated(steps=3, warmup_steps=0, bf16=True, activation_checkpointing=True, checkpoint_every=0, storage_path=str(tmp_path)), QUIET)
    assert s["steps"] == 3 and 7.0 < s["first_loss"] < 9.5 and s["final_loss"] < s["first_loss"]
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(s["export"])
    assert model.dtype == torch.bfloat16
    names = set(dict(model.named_parameters()))
    assert "model.layers.0.self_attn.q_proj.weight" in names and not any("_checkpoint_wrapped" in n for n in names)


def test_preflight_runs_on_the_same_workers_before_training(base: TrainConfig, local_ray: None, tmp_path: Path) -> None:
    s = run(base.updated(steps=2, checkpoint_every=0, preflight=True, storage_path=str(tmp_path)), QUIET)
    pf = s["preflight"]
    assert pf["ok"] is True and pf["backend"] == "gloo"
    assert s["steps"] == 2
    figures = [m for m in pf["measurements"] if m["op"] == "all_reduce"]
    assert figures and all(m["busbw_gbytes_s"] > 0 for m in figures)
