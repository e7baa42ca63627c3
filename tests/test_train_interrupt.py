"""`raydlc train` as a person runs it (the console script in a subprocess): a relative model
directory trains, and Ctrl-C (SIGINT to the process group, as a terminal sends it) exits 130 with
one line naming the last checkpoint, after which the same command with `--resume` continues."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RAYDLC = Path(sys.executable).with_name("raydlc")
TINY_RUN = ["--seq-len", "32", "--batch-size", "2", "--workers", "2"]


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_ADDRESS"))}
    out["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"
    return out


def test_a_relative_model_directory_trains(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from raydlc.data import tokenizer as T
    from raydlc.data.corpus import bundled_corpus
    from raydlc.facts.models import ModelSpec
    from raydlc.train.model import build_model

    spec = ModelSpec("small", 64, 2, 4, 2, 128, 500, True, max_position_embeddings=512, architecture="llama", qkv_bias=False)
    build_model(spec, seed=1).save_pretrained(tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=40_000)))
    bpe = T.train_bpe([corpus.read_text()], spec.vocab_size)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=T.EOS, pad_token=T.EOS).save_pretrained(tmp_path / "model")
    p = subprocess.run([str(RAYDLC), "train", "--model", "./model", "--data", "corpus.txt", "--steps", "2", *TINY_RUN, "--out", "runs", "--json"],
                       cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["model"] == str(tmp_path / "model")


def test_ctrl_c_exits_130_with_one_line_and_resume_continues(tmp_path: Path) -> None:
    args = [str(RAYDLC), "train", "--steps", "100000", *TINY_RUN, "--checkpoint-every", "2", "--out", "out", "--run-name", "r1"]
    p = subprocess.Popen(args, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 480
    while not list((tmp_path / "out" / "r1").glob("checkpoint_*/raydlc_checkpoint.json")):
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else "no checkpoint in time"
        time.sleep(1)
    os.killpg(p.pid, signal.SIGINT)  # the whole foreground group, as a terminal's Ctrl-C
    out, err = p.communicate(timeout=180)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("train ", "\r"))]
    assert p.returncode == 130, err[-3000:]
    assert out == ""
    said = [ln for ln in lines if ln.startswith("interrupted: ")]
    assert len(said) == 1 and "training run r1 stopped by Ctrl-C" in said[0] and "checkpoint_" in said[0], err[-3000:]
    assert "Traceback" not in err and "error:" not in err
    hint = next(ln for ln in lines if ln.startswith("  hint: "))
    assert hint.strip().endswith("--resume") and "raydlc train --steps 100000" in hint

    run = tmp_path / "out" / "r1"
    step = max(int(c.name.split("_")[-1]) for c in run.glob("checkpoint_*") if c.is_dir())  # Ray Train keeps checkpoint_manager_snapshot.json beside them
    cut = run / f"checkpoint_{step + 2:06d}"  # what a Ctrl-C during Ray's upload leaves (once in CI): the manifest, a short shard
    if not cut.exists():
        shutil.copytree(run / f"checkpoint_{step:06d}", cut)
        with (cut / "__0_0.distcp").open("r+b") as f:
            f.truncate(f.seek(0, os.SEEK_END) // 2)
    again = [*args[:3], str(step + 2), *args[4:], "--resume", "--json"]
    r = subprocess.run(again, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] and "checkpoint_" in summary["resumed_from"] and summary["steps"] == step + 2
    assert summary["run_dir"] == str(run) and summary["resumed_from_run"] == "r1"  # the same run, continued in its folder
    assert summary["steps_run"] == f"{step + 1}–{step + 2}"  # what this invocation trained
    assert "note: --resume passes over checkpoint" in r.stderr and cut.name in r.stderr.replace("\n", ""), r.stderr[-3000:]
    from raydlc.train.checkpoint import verify

    assert verify(cut).step == step + 2  # the resumed run's own save of that step replaced what was cut
