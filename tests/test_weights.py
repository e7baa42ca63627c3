"""Pretrained weights loaded shard by shard (raydlc.train.weights) against a plain full load.

The models are exported with `save_pretrained` (bf16 safetensors split over several files, as
the hub ships them) and read back three ways: `from_pretrained` (the reference), the sharded
path on two gloo processes (fast, tiny models, both architectures, tied and untied), and the
product's build step under two Ray Train workers on a model of a few hundred MB, where each
worker's peak host memory is measured.
"""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from raydlc.errors import InputError, TrainError
from raydlc.facts.models import ModelSpec
from raydlc.train.model import build_model
from raydlc.train.weights import build_sharded, load_shards, safetensors_files, weights_dir

LLAMA3_ROPE = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0), ("original_max_position_embeddings", 1024), ("rope_type", "llama3"))
TINY = {
    "llama-tied": ModelSpec("llama-tied", 128, 3, 4, 2, 256, 1000, True, max_position_embeddings=4096, rope_theta=500_000.0,
                            architecture="llama", qkv_bias=False, rope_scaling=LLAMA3_ROPE),
    "qwen2-untied": ModelSpec("qwen2-untied", 128, 3, 4, 2, 256, 1001, False, max_position_embeddings=4096),
}
IDS = torch.arange(24).reshape(2, 12) * 37 % 1000


def export(spec: ModelSpec, directory: Path, shard_size: str) -> Path:
    """A random model of `spec` as save_pretrained writes it: bf16 safetensors in several files."""
    model = build_model(spec, seed=3).to(torch.bfloat16)
    model.save_pretrained(directory, max_shard_size=shard_size)
    del model
    gc.collect()
    assert len(safetensors_files(directory)) > 1
    return directory


def full_load(directory: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_worker(rank: int, port: int, directory: str, out: str) -> None:
    """One of two processes: the sharded load (with activation checkpointing wrappers, whose
    names state dicts must see through), its local shards and a forward pass, saved for the test."""
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh

    from raydlc.train.model import apply_fsdp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        model = build_sharded(directory, device=torch.device("cpu"), shard=lambda m: apply_fsdp(m, mesh=mesh, activation_checkpointing=True))
        local = {n.replace("_checkpoint_wrapped_module.", ""): p.to_local().contiguous() for n, p in model.named_parameters()}
        offsets = {n.replace("_checkpoint_wrapped_module.", ""): p.__create_chunk_list__()[0].offsets[0] for n, p in model.named_parameters()}
        with torch.no_grad():
            logits = model(input_ids=IDS).logits
        save_file(local | {"__logits__": logits}, f"{out}/rank{rank}.safetensors")
        Path(out, f"rank{rank}.json").write_text(json.dumps({"offsets": offsets, "tied": model.lm_head.weight is model.model.embed_tokens.weight}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def check_shards(ref: Any, out: Path, world: int = 2) -> dict[str, Any]:
    """Every rank's local shard equals its rows of the full load, bit for bit, and the shards tile each tensor."""
    from safetensors.torch import load_file

    params = dict(ref.named_parameters())
    ranks = [(load_file(out / f"rank{r}.safetensors"), json.loads((out / f"rank{r}.json").read_text())) for r in range(world)]
    assert sorted(k for k in ranks[0][0] if k != "__logits__") == sorted(params)
    for name, full in params.items():
        rows = 0
        for tensors, meta in ranks:
            shard, start = tensors[name], meta["offsets"][name]
            assert torch.equal(shard, full[start : start + shard.shape[0]]), f"{name}: rows {start}.. differ from the full load"
            rows += shard.shape[0]
        assert rows == full.shape[0], f"{name}: shards cover {rows} of {full.shape[0]} rows"
    return {"logits": ranks[0][0]["__logits__"], "meta": [m for _, m in ranks]}


@pytest.mark.parametrize("name", list(TINY))
def test_sharded_load_equals_the_full_load_on_two_processes(name: str, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    spec = TINY[name]
    directory = export(spec, tmp_path / "model", "60KB")
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(_gloo_worker, args=(_free_port(), str(directory), str(out)), nprocs=2)
    ref = full_load(directory)
    got = check_shards(ref, out)
    with torch.no_grad():
        want = ref(input_ids=IDS).logits
    # Same fp32 weights, same ops: the RoPE buffers rebuilt after `to_empty` are the constructor's.
    assert torch.allclose(got["logits"], want, atol=1e-5, rtol=0), (got["logits"] - want).abs().max()
    assert all(m["tied"] == spec.tie_embeddings for m in got["meta"])


def test_without_a_process_group_it_loads_a_plain_model(tmp_path: Path) -> None:
    """One process, no FSDP: the same reader fills a meta-built model (DCP runs without a group)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from raydlc.train.weights import reset_computed_buffers

    directory = export(TINY["llama-tied"], tmp_path / "m", "60KB")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.float32)
    model.to_empty(device="cpu")
    with pytest.raises(TrainError, match="tie_weights"):  # to_empty gave the head storage of its own
        load_shards(model, directory)
    model.tie_weights()
    reset_computed_buffers(model, torch.device("cpu"))
    stats = load_shards(model, directory)
    ref = full_load(directory)
    assert stats["tensors"] == len(dict(ref.named_parameters())) and stats["files"] > 1
    for (n, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


def test_weights_that_do_not_match_the_config_are_refused_before_any_read(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = export(TINY["qwen2-untied"], tmp_path / "m", "60KB")
    victim = next(f for f in safetensors_files(directory) if "lm_head.weight" in load_file(f))
    tensors = load_file(victim)
    del tensors["lm_head.weight"]
    save_file(tensors, victim)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.float32)
    model.to_empty(device="cpu")
    with pytest.raises(InputError, match=r"lack 1 of the model's tensors \(lm_head\.weight\)"):
        load_shards(model, directory)


def test_directories_without_safetensors_and_uncached_hub_ids_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(InputError, match=r"no \.safetensors files"):
        safetensors_files(tmp_path / "m")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="not in the local hub cache"):
        weights_dir("Qwen/Qwen2.5-7B")


# ---- two Ray Train workers, a model of a few hundred MB ------------------------------------------

# Llama shape, tied: 123,034,624 parameters, 246 MB as bf16 safetensors, 492 MB loaded as fp32.
MEDIUM = ModelSpec("medium", 1024, 8, 16, 4, 2816, 32000, True, max_position_embeddings=4096, rope_theta=500_000.0,
                   architecture="llama", qkv_bias=False, rope_scaling=LLAMA3_ROPE)


def _status_kib(key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))  # type: ignore[union-attr]


def _reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets the peak resident set (VmHWM) to the current one."""
    Path("/proc/self/clear_refs").write_text("5")


def ray_sharded_loop(config: dict[str, Any]) -> None:
    """The product's build step (raydlc.train.loop.build) on a local model directory, with the
    worker's resident set measured around it."""
    import ray.train
    import torch.distributed as dist
    from safetensors.torch import save_file

    from raydlc.config import TrainConfig
    from raydlc.train.layout import Mesh
    from raydlc.train.loop import build

    rank = ray.train.get_context().get_world_rank()
    # Import what the load imports (transformers' modelling code, DCP, FSDP) first: the figure is
    # the memory the weights cost, not the libraries.
    import torch.distributed.checkpoint
    import torch.distributed.fsdp
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config["dir"]))
    gc.collect()
    dist.barrier()
    before = _status_kib("VmRSS")
    _reset_peak()
    t = build(
        TrainConfig(model_id=config["dir"]), spec=None, device=torch.device("cpu"), bf16=False,
        mesh=Mesh(sharding="fsdp", world_size=2, ranks_per_node=[2], replicas=1, shard=2),
    )
    peak = _status_kib("VmHWM")
    params = list(t.model.named_parameters())
    local = {n: p.to_local().contiguous() for n, p in params}
    offsets = {n: p.__create_chunk_list__()[0].offsets[0] for n, p in params}
    with torch.no_grad():
        logits = t.model(input_ids=IDS).logits
    save_file(local | {"__logits__": logits}, f"{config['out']}/rank{rank}.safetensors")
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps({
        "offsets": offsets, "rss_before_kib": before, "peak_kib": peak, "local_bytes": sum(v.numel() * v.element_size() for v in local.values()),
    }))
    del t, local, params
    gc.collect()
    dist.barrier()


def full_load_growth(directory: Path) -> int:
    """The reference: how much a full `from_pretrained` grows the resident set, measured the workers' way
    but in a fresh process. A long-lived pytest worker reuses heap pages earlier tests freed, so the same
    load measured there grew by 375 MB in one CI run and 739 MB alone."""
    code = (
        "import gc, re, sys\nfrom pathlib import Path\nimport torch\nfrom transformers import AutoModelForCausalLM\n"
        "kib = lambda k: int(re.search(rf'^{k}:\\s+(\\d+) kB', Path('/proc/self/status').read_text(), re.M).group(1))\n"
        "gc.collect(); before = kib('VmRSS'); Path('/proc/self/clear_refs').write_text('5')\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, attn_implementation='sdpa')\n"
        "print((kib('VmHWM') - before) * 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True, timeout=300, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_ray_workers_load_a_300mb_model_shard_by_shard_with_half_the_memory(ray_local: Any, tmp_path: Path) -> None:
    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    directory = export(MEDIUM, tmp_path / "model", "50MB")
    file_bytes = sum(f.stat().st_size for f in safetensors_files(directory))
    full_fp32 = MEDIUM.param_count() * 4
    out = tmp_path / "out"
    out.mkdir()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    TorchTrainer(
        ray_sharded_loop,
        train_loop_config={"dir": str(directory), "out": str(out)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="sharded-load", storage_path=str(tmp_path / "ray")),
    ).fit()

    full_peak = full_load_growth(directory)
    ref = full_load(directory)
    got = check_shards(ref, out)
    with torch.no_grad():
        want = ref(input_ids=IDS).logits
    assert torch.allclose(got["logits"], want, atol=1e-4, rtol=0), (got["logits"] - want).abs().max()

    mb = 1e6
    for rank, meta in enumerate(got["meta"]):
        grew = (meta["peak_kib"] - meta["rss_before_kib"]) * 1024
        msg = (
            f"rank {rank}: peak host memory grew by {grew / mb:.0f} MB while loading; its shard is {meta['local_bytes'] / mb:.0f} MB, "
            f"the whole model {full_fp32 / mb:.0f} MB as fp32 ({file_bytes / mb:.0f} MB of bf16 safetensors); "
            f"from_pretrained here grew by {full_peak / mb:.0f} MB"
        )
        print(msg)
        assert meta["local_bytes"] == pytest.approx(full_fp32 / 2, rel=0.02), msg
        assert grew < 0.7 * full_fp32, msg  # about its half, never the whole
        assert grew < 0.75 * full_peak, msg


@pytest.mark.slow
def test_a_run_from_a_model_directory_starts_from_its_weights(ray_local: Any, tmp_path: Path) -> None:
    """`MODEL_ID=<dir>` end to end: the driver reads its config.json and tokenizer, the workers load
    the weights shard by shard, and step 1's loss is the loss the full-loaded model gives that batch."""
    import numpy as np
    from transformers import PreTrainedTokenizerFast

    from raydlc.config import TrainConfig
    from raydlc.data import tokenizer as T
    from raydlc.data.corpus import bundled_corpus
    from raydlc.data.order import global_batch, train_rows
    from raydlc.train.launch import prepare, run
    from raydlc.train.loop import loss_sum, to_batch
    from raydlc.train.runspec import RunTarget

    spec = TINY["llama-tied"]
    directory = export(spec, tmp_path / "model", "60KB")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=60_000)))
    bpe = T.train_bpe([corpus.read_text()], spec.vocab_size)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=T.EOS, pad_token=T.EOS).save_pretrained(directory)

    train = TrainConfig(model_id=str(directory), data=str(corpus), steps=2, seq_len=32, batch_size=2, num_workers=2,
                        learning_rate=1e-3, storage_path=str(tmp_path / "runs"), warmup_steps=0)
    summary = run(train, RunTarget(log_to_driver=False))
    assert summary["steps"] == 2 and summary["model"] == str(directory)

    p = prepare(train)
    gidx = global_batch(1, p.n_train, train.batch_size * train.num_workers, train.seed)
    ids, labels = p.data.open().take(train_rows(gidx, np.asarray(p.data.eval_rows)))
    batch = np.arange(len(ids))
    ref = full_load(directory)
    with torch.no_grad():
        total, n = loss_sum(ref, *to_batch(ids[batch], labels[batch], torch.device("cpu")))
    assert summary["first_loss"] == pytest.approx(float(total / n), abs=1e-4)
    # A random model of this vocabulary scores about ln(1000) = 6.9 nats; the export is its trained continuation.
    assert abs(summary["first_loss"] - np.log(spec.vocab_size)) < 1.0
    exported = full_load(Path(summary["export"]))
    assert exported.config.tie_word_embeddings and sum(p.numel() for p in exported.parameters()) == spec.param_count()
