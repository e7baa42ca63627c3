"""Settings resolved once: the request, the cluster, the prepared inputs and Ray's grant make the RunSpec."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydlc.config import TrainConfig
from raydlc.data.tokenizer import TokenizerInfo
from raydlc.errors import CheckpointError, ConfigError, InputError
from raydlc.facts.models import SPECS
from raydlc.train import resolve as R
from raydlc.train.faults import Crash
from raydlc.train.runspec import Prepared, RunSpec, RunTarget

G6 = RunTarget(address="127.0.0.1:6379", instance_type="g6.12xlarge")


def prepared(model: str | None = "qwen2.5-1.5b", n_train: int = 100_000, **kw: object) -> Prepared:
    base: dict[str, object] = dict(
        builtin=model, model=SPECS[model] if model else None, data=None, tokenizer=TokenizerInfo(eos_id=0, vocab_size=10, tokenizer_json="{}"),
        storage="s3://bucket/runs", run_name="run-x", resume_from=None, n_train=n_train, n_eval=64, data_digest="abc",
    )
    return Prepared(**(base | kw))  # type: ignore[arg-type]


def test_a_cluster_grant_resolves_workers_gpus_and_the_planners_step_without_touching_the_request() -> None:
    request = TrainConfig(model_id="qwen2.5-1.5b", grad_accum="auto", storage_path="s3://bucket/runs")
    before = request.model_dump()
    spec = R.resolve(request, G6, prepared(), R.Granted({"CPU": 96.0, "GPU": 8.0}, (4, 4, 0)))
    assert request.model_dump() == before  # the request is read, never rebound
    assert isinstance(spec, RunSpec) and RunSpec.from_wire(spec.to_wire()) == spec
    t = spec.train
    assert (t.num_workers, t.use_gpu, spec.use_gpu, spec.bf16) == (8, True, True, True)
    assert isinstance(t.grad_accum, int) and t.grad_sync != "auto"
    assert spec.layout_note.startswith("planned: ")
    # The planner's own pick, checkpointing searched (ACTIVATION_CHECKPOINTING left empty).
    from raydlc import planner

    best = planner.recommend(planner.Workload(SPECS["qwen2.5-1.5b"], seq_len=t.seq_len), planner.layout_for(2, 4, instance_type="g6.12xlarge"),
                             checkpointing=(False, True)).best
    assert best is not None and (spec.mesh.sharding, spec.mesh.ranks_per_node, t.batch_size, t.activation_checkpointing) == (
        best.strategy, [4, 4], best.micro_batch, best.activation_checkpointing)
    assert spec.global_batch == t.batch_size * t.grad_accum * 8 and spec.global_batch * t.seq_len <= t.max_global_batch
    assert (spec.run_dir, spec.spec, spec.data_digest) == ("s3://bucket/runs/run-x", "qwen2.5-1.5b", "abc")


def test_a_local_grant_is_one_node_of_the_workers_asked_for_and_plans_nothing() -> None:
    request = TrainConfig(model_id="tiny", num_workers=2, batch_size=8, grad_accum="auto")
    spec = R.resolve(request, RunTarget(faults=Crash(rank=1, step=3)), prepared("tiny"), R.Granted.local(request))
    assert (spec.mesh.shape, spec.use_gpu, spec.bf16, spec.train.batch_size, spec.train.grad_accum) == ((2,), False, False, 8, 1)
    assert "no known GPU type" in (spec.layout_note or "") and spec.faults == Crash(rank=1, step=3)
    gpu = request.updated(use_gpu=True)
    assert R.Granted.local(gpu).resources == {"GPU": 2.0}
    # A run on CPU workers does not plan with the cluster's GPU type, even when the target names one.
    cpu = R.resolve(request, G6, prepared("tiny"), R.Granted({"CPU": 8.0}, (8,)))
    assert not cpu.use_gpu and not cpu.layout_note.startswith("planned")  # type: ignore[union-attr]


def test_each_rule_of_the_run_fails_with_its_own_error() -> None:
    ok = TrainConfig(model_id="tiny", num_workers=2)
    with pytest.raises(InputError, match="GPUs were requested but the Ray cluster has none"):
        R.resolve(ok.updated(use_gpu=True), RunTarget(), prepared("tiny"), R.Granted({}, (2,)))
    with pytest.raises(InputError, match="3 workers need 3 worker slots"):
        R.resolve(ok.updated(num_workers=3), RunTarget(), prepared("tiny"), R.Granted({}, (2,)))
    with pytest.raises(InputError, match="one global batch of 16"):
        R.resolve(ok.updated(batch_size=8), RunTarget(), prepared("tiny", n_train=10), R.Granted.local(ok))
    with pytest.raises(ConfigError, match="STORAGE_PATH: 2 nodes"):
        R.resolve(ok, RunTarget(), prepared("tiny", storage="/local"), R.Granted({}, (1, 1)))
    with pytest.raises(CheckpointError, match=r"different run \(seed: checkpoint 1, now 0\)"):
        R.resolve(ok, RunTarget(), prepared("tiny", resume_from="/c", resume_meta={"seed": 1}), R.Granted.local(ok))
    with pytest.raises(InputError, match="--seq-len must be at least 2"):
        R.check_request(ok.updated(seq_len=1), 2)
    with pytest.raises(InputError, match="--workers must be at least 1"):
        R.check_request(ok, 0)
    with pytest.raises(InputError, match="exceeds the model's 2048 positions"):
        R.model_source(ok.updated(seq_len=4096))
    with pytest.raises(InputError, match="not a built-in spec"):
        R.model_source(ok.updated(model_id="gpt5"))
    with pytest.raises(InputError, match="tokenizer has 5000 tokens, the model only 4096"):
        R.check_tokenizer(TokenizerInfo(eos_id=0, vocab_size=5000, tokenizer_json="{}"), SPECS["tiny"])


def test_prepare_keeps_no_settings(tmp_path: Path) -> None:
    """The driver's preparation is facts about the inputs; what the run does with them is the RunSpec's."""
    from dataclasses import fields

    names = {f.name for f in fields(Prepared)}
    assert names.isdisjoint({"train", "decision", "mesh", "use_gpu", "grad_accum"})
