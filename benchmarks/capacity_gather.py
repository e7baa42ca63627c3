"""How much the parallel gather saves: the capacity signals read one at a time vs concurrently.

Runs against a local moto server with an added round-trip delay per request (default
150 ms, roughly what a laptop sees to a distant region), since moto itself answers in
microseconds. Calls moto lacks (Spot scores, EC2 quotas) still take their round trip and
come back unknown, as they would from a restricted account.

    PYTHONPATH=src python benchmarks/capacity_gather.py [--delay-ms 150] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=150.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--region", default="us-west-2")
    parser.add_argument("--instance-type", default="g5.12xlarge")
    args = parser.parse_args()

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1",
    )
    from raydlc import capacity
    from raydlc.edges import aws

    def delay(**kw: Any) -> None:
        time.sleep(args.delay_ms / 1000)

    sess = aws.session(args.region)
    clients = [aws.client(sess, s) for s in ("ec2", "service-quotas", "eks")]
    for c in clients:
        c.meta.events.register("before-send", delay)
    kw = dict(region=args.region, instance_type=args.instance_type, count=2, cluster="bench")
    capacity.gather(*clients, **kw)  # warm moto's region backend

    results: dict[int, list[float]] = {}
    for workers in (1, 8):
        for _ in range(args.repeat):
            t = time.perf_counter()
            capacity.gather(*clients, max_workers=workers, **kw)
            results.setdefault(workers, []).append(time.perf_counter() - t)
    server.stop()
    seq, par = statistics.median(results[1]), statistics.median(results[8])
    print(f"round trip +{args.delay_ms:g} ms, {args.instance_type} in {args.region}, median of {args.repeat}:")
    print(f"  sequential (1 worker):  {seq:.2f} s")
    print(f"  parallel   (8 workers): {par:.2f} s  ({seq / par:.1f}x faster)")


if __name__ == "__main__":
    main()
