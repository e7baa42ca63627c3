"""A built-in spec at random init is built on the meta device, sharded, materialised and initialised
shard by shard (train.model.build_random_sharded): its values are transformers' scheme, depend on the
seed only (not on the number of ranks), and a rank's peak host memory while building is about its shard."""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tests.test_train_step import world_of_one

from raydlc.facts.models import ModelSpec, get_spec
from raydlc.train.model import apply_fsdp, build_model, build_random_sharded, tied

SMALL = replace(get_spec("tiny"), num_layers=2)
# Llama shape, tied: 123,034,624 parameters, 492 MB as fp32 (as tests/test_weights.py's MEDIUM).
MEDIUM = ModelSpec("medium", 1024, 8, 16, 4, 2816, 32000, True, max_position_embeddings=4096, rope_theta=500_000.0,
                   architecture="llama", qkv_bias=False)


def full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone() for k, v in model.state_dict().items()}


def test_the_init_is_transformers_scheme_seeded_and_tied() -> None:
    with world_of_one():
        model = build_random_sharded(SMALL, device=torch.device("cpu"), shard=apply_fsdp, seed=3)
        again = full(build_random_sharded(SMALL, device=torch.device("cpu"), shard=apply_fsdp, seed=3))
        other = full(build_random_sharded(SMALL, device=torch.device("cpu"), shard=apply_fsdp, seed=4))
        values = full(model)
        assert tied(model)
        with torch.no_grad():
            ids = torch.randint(0, SMALL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
            loss = model(input_ids=ids, labels=ids).loss
    assert all(torch.equal(values[k], again[k]) for k in values)  # the seed decides
    assert any(not torch.equal(values[k], other[k]) for k in values if "norm" not in k and "bias" not in k)
    assert all(bool((v == 1).all()) for k, v in values.items() if k.endswith("norm.weight"))
    assert all(bool((v == 0).all()) for k, v in values.items() if k.endswith(".bias"))
    q = values["model.layers.0.self_attn.q_proj.weight"]
    assert abs(float(q.std()) - 0.02) < 0.002 and abs(float(q.mean())) < 0.002
    assert not any(bool(torch.isnan(v).any()) for v in values.values())
    rope = dict(build_model(SMALL).model.rotary_emb.named_buffers())  # rebuilt, not left as to_empty's garbage
    assert all(torch.equal(b, rope[n]) for n, b in model.model.rotary_emb.named_buffers())
    assert abs(float(loss) - torch.log(torch.tensor(float(SMALL.vocab_size)))) < 0.5  # a random model's loss: about ln V


def _status_kib(key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))  # type: ignore[union-attr]


def _rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank: build MEDIUM at random init over `world` ranks with its resident set measured; its shards to `out`."""
    import gc

    import torch.distributed as dist
    import torch.distributed.fsdp  # the libraries first: the figure is the weights' memory
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        build_model(MEDIUM, device="meta")
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set from here
    model = build_random_sharded(MEDIUM, device=torch.device("cpu"), shard=lambda m: apply_fsdp(m, mesh=mesh), seed=7)
    peak = _status_kib("VmHWM")
    params = dict(model.named_parameters())
    local = {n: p.to_local().contiguous() for n, p in params.items()}
    rows = {n: int(p.__create_chunk_list__()[0].offsets[0]) for n, p in params.items()}
    save_file(local, f"{out}/rank{rank}.safetensors")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"grew": (peak - before) * 1024, "rows": rows,
                                                         "local_bytes": sum(v.numel() * 4 for v in local.values())}))
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    _rank(rank, world, port, out)


@pytest.mark.slow
def test_two_ranks_each_hold_about_their_half_and_draw_the_one_rank_values(tmp_path: Path) -> None:
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    full_fp32 = MEDIUM.param_count() * 4
    results = {}
    for world in (1, 2):
        out = tmp_path / f"w{world}"
        out.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_spawned, args=(world, port, str(out)), nprocs=world, join=True)
        results[world] = [(load_file(str(out / f"rank{r}.safetensors")), json.loads((out / f"rank{r}.json").read_text())) for r in range(world)]
    (whole, _), = results[1]
    for shards, meta in results[2]:
        for name, local in shards.items():  # the same values whatever the number of ranks
            first = meta["rows"][name]
            assert torch.equal(local, whole[name][first : first + len(local)]), name
        mb = 1e6
        msg = (f"peak host memory grew by {meta['grew'] / mb:.0f} MB while building; the shard is {meta['local_bytes'] / mb:.0f} MB, "
               f"the whole model {full_fp32 / mb:.0f} MB as fp32")
        print(msg)
        assert meta["local_bytes"] == pytest.approx(full_fp32 / 2, rel=0.02), msg
        assert meta["grew"] < 0.7 * full_fp32, msg  # about its half (and one 64 MB block), never the whole
    assert results[1][0][1]["grew"] > 0.9 * full_fp32  # the measure sees a whole model when a rank holds one


def test_activation_checkpointing_does_not_change_the_init() -> None:
    """The init seeds each parameter by its state-dict name: the checkpoint wrapper's `_checkpoint_wrapped_module.`
    in the parameter names must not draw another model for the same seed (it did before the names were stripped)."""
    with world_of_one():
        plain = full(build_random_sharded(SMALL, device=torch.device("cpu"), shard=apply_fsdp, seed=3))
        wrapped = build_random_sharded(SMALL, device=torch.device("cpu"), shard=lambda m: apply_fsdp(m, activation_checkpointing=True), seed=3)
        assert any("_checkpoint_wrapped_module" in n for n, _ in wrapped.named_parameters())  # the names do change
        values = full(wrapped)
    assert set(values) == set(plain)
    assert all(torch.equal(values[k], plain[k]) for k in plain)
