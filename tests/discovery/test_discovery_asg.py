"""Cluster Autoscaler node groups at zero, read from their ASG tags on a real moto server (autoscaling API)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import servers  # tests/doubles, on sys.path by tests/discovery/conftest.py

from raydlc.discovery import facts as F
from raydlc.discovery.gather import Raw, Reads, auto_scaling_groups
from raydlc.discovery.read import discover
from raydlc.discovery.target import pick
from raydlc.errors import AwsError

CLUSTER = "platform-eks"
TAG = "k8s.io/cluster-autoscaler/node-template/"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with servers.moto_process() as url:
        yield url


def autoscaling(url: str) -> Any:
    import boto3

    return boto3.client("autoscaling", region_name="us-east-2", endpoint_url=url, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def make_group(cli: Any, name: str, itype: str, tags: dict[str, str]) -> None:
    cli.create_launch_configuration(LaunchConfigurationName=f"{name}-lc", ImageId="ami-12c6146b", InstanceType=itype)
    cli.create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchConfigurationName=f"{name}-lc", MinSize=0, MaxSize=4, DesiredCapacity=0,
        AvailabilityZones=["us-east-2a"],
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True, "ResourceId": name, "ResourceType": "auto-scaling-group"}
              for k, v in tags.items()])


def eks_reads(asgs: list[dict[str, Any]]) -> Reads:
    none = Raw("list", items=())
    return Reads(namespace="team-a", version=Raw("GET /version", items=({"gitVersion": "v1.33.5-eks-3025e55"},)), crds=none,
                 deployments=none, nodes=none, daemonsets=none, nodepools=Raw("list nodepools", items=(), served=False),
                 asgs=Raw("autoscaling:DescribeAutoScalingGroups", items=tuple(asgs)))


def test_a_gpu_group_at_zero_is_capacity_that_can_come(moto_url: str) -> None:
    cli = autoscaling(moto_url)
    make_group(cli, "gpu-ng", "g6.12xlarge", {
        f"k8s.io/cluster-autoscaler/{CLUSTER}": "owned", "k8s.io/cluster-autoscaler/enabled": "true",
        f"{TAG}label/node.kubernetes.io/instance-type": "g6.12xlarge", f"{TAG}taint/nvidia.com/gpu": "true:NoSchedule"})
    make_group(cli, "other-cluster-ng", "g6.12xlarge", {"k8s.io/cluster-autoscaler/someone-else": "owned"})
    groups = auto_scaling_groups(cli, CLUSTER)
    assert [g["AutoScalingGroupName"] for g in groups] == ["gpu-ng"]
    f = discover(eks_reads(groups), cluster_name=CLUSTER)
    (g,) = f.asg_groups.value
    assert (g.name, g.instance_type, g.max_size, g.desired, g.taints) == ("gpu-ng", "g6.12xlarge", 4, 0,
                                                                         (F.Taint("nvidia.com/gpu", "true", "NoSchedule"),))
    t = pick(f)
    assert t.instance_type == "g6.12xlarge" and t.source.startswith("Cluster Autoscaler node group gpu-ng at zero")
    assert t.toleration_list() == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]


def test_an_aws_error_is_a_raydlc_error_the_gather_keeps_as_a_refusal(moto_url: str) -> None:
    from raydlc.discovery.gather import _aws_read

    def refused() -> list[dict[str, Any]]:
        raise AwsError("AccessDenied: autoscaling:DescribeAutoScalingGroups")

    raw = _aws_read("autoscaling:DescribeAutoScalingGroups", refused)
    f = discover(Reads(namespace="n", version=Raw("v", items=({"gitVersion": "v1.33.5-eks-1"},)), crds=Raw("c", items=()),
                       deployments=Raw("d", items=()), nodes=Raw("n", items=()), daemonsets=Raw("d", items=()),
                       nodepools=Raw("p", items=()), asgs=raw))
    assert f.asg_groups.state is F.State.UNKNOWN and "AccessDenied" in f.asg_groups.note
