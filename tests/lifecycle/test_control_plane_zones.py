"""Control-plane zones against moto's us-east-1, where EKS refuses use1-az3 (moto's us-east-1e)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from raydlc import lifecycle
from raydlc.lifecycle import Timings

pytestmark = pytest.mark.slow

# Budgets, not speed targets: a wait ends as soon as its condition holds; a loaded machine needs the room.
FAST = Timings(poll_s=0.1, cluster_s=60, nodegroup_s=60, stack_s=60, helm_s=60, nodes_s=30, plugins_s=60, pods_s=90)
CLUSTER = "eks-cluster"
REFUSED = "us-east-1e"  # use1-az3 in moto's us-east-1


def zone_ids(world) -> dict[str, str]:
    return {z["ZoneName"]: z["ZoneId"] for z in world.client("ec2").describe_availability_zones()["AvailabilityZones"]}


def test_up_in_us_east_1_never_puts_use1_az3_in_the_cluster(world) -> None:
    world.in_region("us-east-1")
    assert zone_ids(world)[REFUSED] == "use1-az3"
    run = lifecycle.up(world.config(), until="cluster", timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    rendered = yaml.safe_load((Path(os.environ["HOME"]) / ".raydlc" / f"{CLUSTER}-us-east-1" / "eksctl-cluster.yaml").read_text())
    zones = rendered["availabilityZones"]
    assert REFUSED not in zones and 2 <= len(zones) <= 3, zones  # EKS's minimum; eksctl's recommended at most
    ids = zone_ids(world)
    subnets = world.client("eks").describe_cluster(name=CLUSTER)["cluster"]["resourcesVpcConfig"]["subnetIds"]
    got = {ids[s["AvailabilityZone"]] for s in world.client("ec2").describe_subnets(SubnetIds=subnets)["Subnets"]}
    assert "use1-az3" not in got and len(got) == len(zones)


def test_a_gpu_az_eks_refuses_is_refused_before_anything_is_created(world, capsys) -> None:
    from raydlc.cli import main

    world.in_region("us-east-1")
    world.monkeypatch.setenv("RAYDLC_GPU_AZ", REFUSED)
    before = world.aws_snapshot()
    assert main(["up"]) == 2
    err = capsys.readouterr().err
    assert f"error: GPU_AZ {REFUSED}" in err and "zone ID use1-az3" in err and "EKS refuses control-plane subnets" in err
    assert "hint: raydlc capacity" in err
    assert world.mutating_calls() == [] and world.aws_snapshot() == before


def test_eks_refuses_a_control_plane_in_use1_az3_and_down_clears_the_protected_stack_left(world) -> None:
    """The doubles as AWS: eksctl's stack rolls back protected; `down` unprotects and removes it."""
    from raydlc.render import render_all, to_yaml

    world.in_region("us-east-1")
    f = world.tmp / "c.yaml"
    f.write_text(to_yaml(render_all(world.config(), [REFUSED, "us-east-1a"], only="eksctl")["eksctl-cluster.yaml"]))
    r = subprocess.run(["eksctl", "create", "cluster", "--config-file", str(f), "--without-nodegroup"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and f"Cannot create cluster '{CLUSTER}' because {REFUSED}" in r.stdout, (r.stdout, r.stderr)
    assert 'AWS::EKS::Cluster/ControlPlane: CREATE_FAILED' in r.stdout
    cfn = world.client("cloudformation")
    st = cfn.describe_stacks(StackName=f"eksctl-{CLUSTER}-cluster")["Stacks"][0]
    assert (st["StackStatus"], st["EnableTerminationProtection"]) == ("ROLLBACK_COMPLETE", True)
    assert world.client("eks").list_clusters()["clusters"] == []
    run = lifecycle.down(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert f"stack eksctl-{CLUSTER}-cluster" in " ".join(run.to_dict()["removed"])
    assert world.tagged(CLUSTER) == {}
