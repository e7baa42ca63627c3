"""lm-evaluation-harness through `raydlc eval --tasks`, against lm-eval's own CLI on the same export.

Its tasks read the Hub on a real machine; here a multiple-choice task on a local JSON Lines file (`dataset_path:
json`), found through `include_path`. Skipped by name where lm-eval is not installed (it is in the dev extra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (raydlc[eval])")

from tests.test_evaluate_export import bpe_info, export

from raydlc.evaluate import harness

QUESTIONS = [
    {"question": "2 + 2 =", "choices": [" 4", " 5", " 22"], "answer": 0},
    {"question": "def f(x):", "choices": ["\n    return x", " banana split"], "answer": 0},
    {"question": "<|im_start|>user\n", "choices": ["Hello<|im_end|>", "zzz qqq"], "answer": 1},
    {"question": "The cat", "choices": [" sat", " on", " mat", " the"], "answer": 2},
    {"question": "return", "choices": [" x", " y"], "answer": 1},
]


def task_folder(tmp: Path) -> Path:
    folder = tmp / "tasks"
    folder.mkdir()
    data = tmp / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (folder / "raydlc_local.yaml").write_text(
        "task: raydlc_local\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    return folder


@pytest.mark.slow  # lm-eval's CLI indexes its thousands of task files: minutes on two cores
def test_a_local_task_scores_as_lm_evals_own_cli(tmp_path: Path) -> None:
    out = export(tmp_path, bpe_info())
    tasks = task_folder(tmp_path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(out), dtype="float32").eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    mine = harness.run(model, tok, ["raydlc_local"], include_path=str(tasks))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={out},dtype=float32",
                        "--tasks", "raydlc_local", "--include_path", str(tasks), "--device", "cpu", "--batch_size", "1",
                        "--output_path", str(tmp_path / "cli")], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    [found] = list((tmp_path / "cli").rglob("results_*.json"))
    theirs = harness.metrics_of(json.loads(found.read_text())["results"])
    assert set(mine["raydlc_local"]) >= {"acc", "acc_norm"}
    assert mine["raydlc_local"]["acc"] == theirs["raydlc_local"]["acc"]
    assert mine["raydlc_local"]["acc_norm"] == theirs["raydlc_local"]["acc_norm"]


def test_an_unknown_task_is_one_clear_error(tmp_path: Path) -> None:
    from raydlc.errors import InputError

    with pytest.raises(InputError, match="knows no task no_such_task"):
        harness.run(object(), object(), ["no_such_task"], include_path=str(task_folder(tmp_path)))
