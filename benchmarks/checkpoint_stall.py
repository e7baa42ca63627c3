"""How long a checkpoint stops the training loop: the blocking save against the asynchronous one.

    python benchmarks/checkpoint_stall.py [--model qwen2.5-0.5b] [--layers 4] [--repeat 2]

One process (gloo, world size 1, CPU): a built-in spec at its real width and vocabulary with
`--layers` blocks, sharded by raydlc's `apply_fsdp`, AdamW state filled by one step. Then per
repeat: `train.checkpoint.save` (DCP write, SHA-256 of every file, manifest: all in the loop) and
`start` + `seal` (the loop waits only for the shards' copy to host memory, into the run's cached
stager after the first save; DCP writes and a thread hashes while training would go on). Prints the loop's stall of each, the asynchronous
save's time to complete, and the bytes written; one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    from raydlc.facts.models import get_spec
    from raydlc.train import checkpoint as C
    from raydlc.train.model import apply_fsdp, build_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    spec = replace(get_spec(args.model), num_layers=args.layers)
    model = apply_fsdp(build_model(spec))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, spec.vocab_size, (1, 32))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    group = dist.new_group(backend="gloo")
    blocking, stalls, completes, size = [], [], [], 0
    staging = C.stager(cuda=False)  # the run's cached host copy, as the loop's Saver keeps it from one save to the next
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            d = Path(tmp) / f"sync{i}"
            t0 = time.perf_counter()
            C.save(d, model, opt, step=i, rank=0, world_size=1, extra={}, meta={})
            blocking.append(time.perf_counter() - t0)
            size = sum(p.stat().st_size for p in d.iterdir())
            d = Path(tmp) / f"async{i}"
            t0 = time.perf_counter()
            digests = C.start(d, model, opt, step=i, rank=0, extra={}, group=group, staging=staging)
            stalls.append(time.perf_counter() - t0)
            C.seal(d, digests.result(), step=i, rank=0, world_size=1, meta={})
            completes.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    later = stalls[1:] or stalls  # the first save fills the cache; every later one copies into it
    out = {
        "model": args.model, "layers": args.layers, "bytes": size,
        "blocking_save_s": min(blocking), "async_stall_first_s": stalls[0], "async_stall_s": min(later), "async_complete_s": min(completes),
    }
    out["stall_share"] = out["async_stall_s"] / out["blocking_save_s"]
    print(f"{args.model} x {args.layers} blocks, {size / 2**20:.0f} MiB per checkpoint:")
    print(f"  blocking save (write + hash in the loop): {out['blocking_save_s']:.2f} s")
    print(f"  async save, the loop's stall:             {out['async_stall_s']:.2f} s = {out['stall_share']:.0%} of the blocking save"
          f"  (first save, filling the cache: {out['async_stall_first_s']:.2f} s; complete after {out['async_complete_s']:.2f} s)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
