"""The Ray token Secret through `up` and `down` against moto, kmock and the doubles: created once before the
RayCluster that names it, kept by a second `up`, never shown; made anew after a delete by hand only together
with new Ray pods (KubeRay reads the token into a pod's environment when the pod starts)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from raydlc import lifecycle
from raydlc.lifecycle import Reporter, StepResult, Timings

pytestmark = pytest.mark.slow

NS, SECRET = "ray-train", "ray-train-cluster-ray-token"
FAST = Timings(poll_s=0.1, cluster_s=120, nodegroup_s=120, stack_s=120, helm_s=120, nodes_s=60, plugins_s=60, pods_s=90)


class Recorder(Reporter):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def line(self, step: str, text: str) -> None:
        self.events.append(("line", step, text))


def by_step(run: lifecycle.Run) -> dict[str, StepResult]:
    return {r.step: r for r in run.results}


def _kube(world: Any) -> Any:
    from world import Kube

    return Kube(world.kube.url)


def token_in(world: Any) -> str:
    secret = world.kube.snapshot()[f"/v1/secrets/{NS}/{SECRET}"]
    return base64.b64decode(secret["data"]["auth_token"]).decode()


def test_up_creates_the_token_secret_once_and_shows_it_nowhere(world, capsys: pytest.CaptureFixture[str]) -> None:
    rec = Recorder()
    run = lifecycle.up(world.config(), timings=FAST, reporter=rec)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    token = token_in(world)
    assert len(base64.urlsafe_b64decode(token + "=")) == 32  # 256 random bits
    snap = world.kube.snapshot()
    rc = snap[f"ray.io/v1/rayclusters/{NS}/ray-train-cluster"]
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": SECRET}
    assert ("line", "raycluster", f"created Secret {SECRET} (a new random Ray token)") in rec.events

    again = lifecycle.up(world.config(), timings=FAST)
    assert again.ok and by_step(again)["raycluster"].action == "none"
    assert token_in(world) == token  # kept, not replaced

    elsewhere = [json.dumps(rec.events), world.log.read_text(), json.dumps(run.to_dict()), json.dumps(again.to_dict())]
    elsewhere += list(capsys.readouterr())
    elsewhere += [p.read_text(errors="replace") for p in (Path(os.environ["HOME"]) / ".raydlc").rglob("*") if p.is_file()]
    elsewhere += [json.dumps(o) for k, o in world.kube.snapshot().items() if k != f"/v1/secrets/{NS}/{SECRET}"]
    assert not [t for t in elsewhere if token in t]

    down = lifecycle.down(world.config(), timings=FAST)
    assert down.ok, [(r.step, r.reason) for r in down.failed]
    assert f"/v1/secrets/{NS}/{SECRET}" not in world.kube.snapshot()


def test_a_token_secret_deleted_by_hand_is_made_anew_only_with_new_ray_pods(world) -> None:
    assert lifecycle.up(world.config(), timings=FAST).ok
    first = token_in(world)
    kube = _kube(world)
    for p in kube.list("Pod", NS):  # kmock gives no uid: a label tells the old pods from new ones
        kube.patch("Pod", p["metadata"]["name"], {"metadata": {"labels": {"test/old": "yes"}}}, NS)
    kube.delete("Secret", SECRET, NS)

    plan = by_step(lifecycle.up(world.config(), dry_run=True))["raycluster"]
    assert plan.action == "replace" and f"the Ray token Secret {SECRET} is missing" in plan.reason

    refused = by_step(lifecycle.up(world.config(), timings=FAST))["raycluster"]
    assert refused.outcome == "failed" and "so nothing was changed" in refused.reason
    assert f"/v1/secrets/{NS}/{SECRET}" not in world.kube.snapshot()
    assert all(p["metadata"]["labels"].get("test/old") for p in kube.list("Pod", NS))

    agreed = lifecycle.up(world.config(), timings=FAST, yes=True)
    assert agreed.ok, [(r.step, r.reason) for r in agreed.failed]
    assert token_in(world) != first
    pods = kube.list("Pod", NS)
    assert len(pods) == 3 and not any(p["metadata"]["labels"].get("test/old") for p in pods)  # every Ray pod is new
