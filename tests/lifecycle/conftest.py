"""The world `raydlc up`/`down`/`status` run against here: moto, kmock, and the tool doubles on PATH.

- AWS: a real moto server on 127.0.0.1 (EKS, CloudFormation, EC2), reset before each test.
  Where moto has no path to a state (a node group that fails for capacity, a stack in
  ROLLBACK_COMPLETE or DELETE_FAILED), the test flips moto's backend object in this process,
  and says so. EC2 capacity reservations, which moto lacks, are answered by a botocore handler
  from a small table the test holds.
- Kubernetes: kmock on 127.0.0.1 in a thread, its gaps filled in tests/doubles/servers.py,
  never in raydlc.
- Tools: `eksctl` and `helm` on PATH are the recorded doubles in tests/doubles/, first on PATH
  ahead of any real tool; `aws` and `aws-iam-authenticator` are kept off PATH (a new user with
  boto3 credentials only), so the kubeconfig works only through `raydlc eks-token`; KUBECONFIG is unset and HOME is the test's own, so nothing
  can reach a real cluster or a real account.
- The KubeRay operator and the scheduler: tests/doubles/kuberay.py in a thread.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"
sys.path.insert(0, str(DOUBLES))

import awsstub  # noqa: E402
import eks_state  # noqa: E402
import iam_simulator  # noqa: E402
import servers  # noqa: E402
from kuberay import Operator  # noqa: E402
from servers import KubeServer  # noqa: E402

REGION = "us-east-2"
ACCOUNT = "123456789012"


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    with servers.moto_server() as url:
        yield url


@pytest.fixture
def kube_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeServer]:
    with servers.kube_server(monkeypatch.setattr) as server:
        yield server


# ---------------------------------------------------------------------- the world


@dataclass
class World:
    tmp: Path
    moto_url: str
    kube: KubeServer
    monkeypatch: pytest.MonkeyPatch
    log: Path
    scenario_file: Path
    reservations: list[dict[str, Any]] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)
    simulations: list[dict[str, Any]] = field(default_factory=list)  # iam:SimulatePrincipalPolicy requests (iam_simulator)
    operations: list[tuple[str, str]] | None = None  # (signing name, operation) of raydlc's AWS calls while recording
    region: str = REGION  # what `client` and `backend` read; `in_region` moves the test elsewhere

    def in_region(self, region: str) -> None:
        """Run the test in another region: moto's EC2 backend there is built now, and REGION is set for raydlc."""
        servers.warm(self.moto_url, region)
        self.region = region
        self.monkeypatch.setenv("RAYDLC_REGION", region)

    # -- doubles

    def scenario(self, **knobs: Any) -> None:
        doc = json.loads(self.scenario_file.read_text() or "{}")
        doc.update(knobs)
        self.scenario_file.write_text(json.dumps(doc))

    def calls(self, tool: str | None = None) -> list[list[str]]:
        if not self.log.exists():
            return []
        recs = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r["argv"] for r in recs if tool is None or r["tool"] == tool]

    def mutating_calls(self) -> list[list[str]]:
        reads = ({"version"}, {"status"}, {"get"})
        return [a for a in self.calls() if not any(a[:1] == list(r) for r in reads) and a[:1] != ["version"]]

    # -- raydlc

    def config(self, **env: str) -> Any:
        from raydlc.config import load_config

        return load_config(env={**{k: v for k, v in os.environ.items() if k.startswith("RAYDLC_")}, **env})

    def client(self, service: str) -> Any:
        from raydlc.edges import aws

        return aws.client(aws.session(self.region), service)

    # -- moto, shaped in this process where the API has no path

    def backend(self, service: str) -> Any:
        from moto.backends import get_backend

        return get_backend(service)[ACCOUNT][self.region]  # type: ignore[index]

    def set_stack_status(self, name: str, status: str) -> None:
        stacks = [s for s in self.backend("cloudformation").stacks.values() if s.name == name]
        assert stacks, f"no stack {name}"
        for s in stacks:
            s.status = status

    def fail_nodegroups_in(self, zones: set[str], instance_type: str = "g6.12xlarge") -> None:
        """moto makes every node group ACTIVE; this flips those whose subnets lie in `zones` to
        CREATE_FAILED with the health issue EKS reports when the Auto Scaling group cannot launch
        for capacity, and their CloudFormation stack to CREATE_FAILED, as CloudFormation would."""
        self._fail_launches_in(
            zones, lambda ng: instance_type in ng.instance_types, "{name} CREATE_FAILED in {az}",
            lambda az: f"Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not "
                       f"have sufficient {instance_type} capacity in the Availability Zone you requested ({az}). "
                       "Our system will be working on provisioning additional capacity. Launching EC2 instance failed.")

    def no_spot_capacity_in(self, zones: set[str]) -> None:
        """EKS's answer when a Spot managed node group's Auto Scaling group cannot launch: the group ends
        CREATE_FAILED with health issue AsgInstanceLaunchFailures, "Could not launch Spot Instances.
        UnfulfillableCapacity - ..." (the EKS API's Issue codes; the launch failure EC2 Auto Scaling reports for
        Spot). On-demand groups in the same zones come up; moto has no failing create: flipped in its backend."""
        self._fail_launches_in(
            zones, lambda ng: ng.capacity_type == "SPOT", "{name} no Spot capacity in {az}",
            lambda az: "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to "
                       "your request configuration. Please adjust your request and try again. Launching EC2 "
                       "instance failed.")

    def spot_quota_exceeded(self) -> None:
        """EC2 refuses every Spot launch past the account's Spot vCPU quota (error MaxSpotInstanceCountExceeded, which
        EKS shows as the group's AsgInstanceLaunchFailures issue); the quota is the region's, so in every AZ.
        moto has no failing create: flipped in its backend."""
        self._fail_launches_in(
            {"us-east-2a", "us-east-2b", "us-east-2c"}, lambda ng: ng.capacity_type == "SPOT", "{name} Spot quota exceeded in {az}",
            lambda az: "Could not launch Spot Instances. MaxSpotInstanceCountExceeded - Max spot instance count exceeded. "
                       "Launching EC2 instance failed.")

    def _fail_launches_in(self, zones: set[str], hit: Any, patch: str, message: Any) -> None:
        """Node groups in `zones` that `hit` selects end CREATE_FAILED with EKS's AsgInstanceLaunchFailures issue
        (`message(az)`), their stack CREATE_FAILED too; each noted in `patches` as `patch` says."""
        from moto.eks.models import EKSBackend

        original = EKSBackend.create_nodegroup
        world = self

        def create_nodegroup(backend: Any, *args: Any, **kw: Any) -> Any:
            ng = original(backend, *args, **kw)
            ec2 = world.backend("ec2")
            azs = {ec2.get_subnet(s).availability_zone for s in ng.subnets}
            if azs & zones and hit(ng):
                az = sorted(azs & zones)[0]
                ng.status = "CREATE_FAILED"
                ng.health = {"issues": [{"code": "AsgInstanceLaunchFailures", "message": message(az),
                                         "resourceIds": [ng.resources["autoScalingGroups"][0]["name"]]}]}
                stack = f"eksctl-{ng.cluster_name}-nodegroup-{ng.nodegroup_name}"
                for s in world.backend("cloudformation").stacks.values():
                    if s.name == stack:
                        s.status = "CREATE_FAILED"
                world.patches.append(patch.format(name=ng.nodegroup_name, az=az))
            return ng

        self.monkeypatch.setattr(EKSBackend, "create_nodegroup", create_nodegroup)

    def spot_price_is(self, usd: float) -> None:
        """moto's DescribeSpotPriceHistory answers one fixed price (0.00001) per AZ; this sets it to `usd`."""
        from moto.core.responses import ActionResult
        from moto.ec2.responses.spot_instances import SpotInstances

        original = SpotInstances.describe_spot_price_history

        def describe_spot_price_history(self_: Any) -> Any:
            out = original(self_)
            return ActionResult({"SpotPriceHistory": [{**p, "SpotPrice": f"{usd}"} for p in out.result["SpotPriceHistory"]]})

        self.monkeypatch.setattr(SpotInstances, "describe_spot_price_history", describe_spot_price_history)

    def roll_back_nodegroups_in(self, zones: set[str], instance_type: str = "g6.12xlarge") -> None:
        """What AWS does when a managed node group cannot launch for capacity: the stack's
        AWS::EKS::Nodegroup resource is CREATE_FAILED with EKS's health issue, CloudFormation rolls the
        stack back (eksctl leaves rollback on) and deletes the node group, and the stack is left
        ROLLBACK_COMPLETE, still termination-protected. moto has no failing create: flipped in its backend."""
        from moto.cloudformation.models import Event
        from moto.eks.models import EKSBackend

        original = EKSBackend.create_nodegroup
        world = self

        def create_nodegroup(backend: Any, *args: Any, **kw: Any) -> Any:
            ng = original(backend, *args, **kw)
            ec2 = world.backend("ec2")
            azs = {ec2.get_subnet(s).availability_zone for s in ng.subnets}
            if azs & zones and instance_type in ng.instance_types:
                az = sorted(azs & zones)[0]
                backend.clusters[ng.cluster_name].nodegroups.pop(ng.nodegroup_name)
                stack = f"eksctl-{ng.cluster_name}-nodegroup-{ng.nodegroup_name}"
                reason = (f"Resource handler returned message: \"[Issue(Code=AsgInstanceLaunchFailures, Message=Could not "
                          f"launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have sufficient "
                          f"{instance_type} capacity in the Availability Zone you requested ({az}).)]\"")
                for s in world.backend("cloudformation").stacks.values():
                    if s.name == stack:
                        s.status = "ROLLBACK_COMPLETE"
                        s.events.append(Event(stack_id=s.stack_id, stack_name=s.name, logical_resource_id="ManagedNodeGroup",
                                              physical_resource_id="", resource_type="AWS::EKS::Nodegroup",
                                              resource_status="CREATE_FAILED", resource_status_reason=reason,
                                              resource_properties=None))
                world.patches.append(f"{ng.nodegroup_name} rolled back in {az}")
            return ng

        self.monkeypatch.setattr(EKSBackend, "create_nodegroup", create_nodegroup)

    def stack_delete_fails_once(self, name: str) -> None:
        """The first DeleteStack of `name` ends DELETE_FAILED (a VPC with dependencies), as CloudFormation does."""
        from moto.cloudformation.models import CloudFormationBackend

        original = CloudFormationBackend.delete_stack
        world = self

        def delete_stack(backend: Any, name_or_id: str) -> None:
            for s in list(backend.stacks.values()):
                if (s.name == name_or_id or s.stack_id == name_or_id) and s.name == name and f"failed {name}" not in world.patches:
                    world.patches.append(f"failed {name}")
                    s.status = "DELETE_FAILED"
                    return
            original(backend, name_or_id)

        self.monkeypatch.setattr(CloudFormationBackend, "delete_stack", delete_stack)

    def aws_snapshot(self) -> dict[str, Any]:
        """What the account holds, read over the API: compared before and after a dry run."""
        eks, cfn, ec2 = self.client("eks"), self.client("cloudformation"), self.client("ec2")
        clusters = eks.list_clusters()["clusters"]
        return {
            "clusters": clusters,
            "nodegroups": {c: eks.list_nodegroups(clusterName=c)["nodegroups"] for c in clusters},
            "stacks": sorted((s["StackName"], s["StackStatus"]) for s in cfn.list_stacks()["StackSummaries"]),
            "instances": sorted((i["InstanceId"], i["State"]["Name"]) for r in ec2.describe_instances()["Reservations"]
                                for i in r["Instances"]),
            "vpcs": sorted(v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]),
            "nat": sorted((n["NatGatewayId"], n["State"]) for n in ec2.describe_nat_gateways()["NatGateways"]),
            "eips": sorted(a["AllocationId"] for a in ec2.describe_addresses()["Addresses"]),
            "reservations": json.dumps(self.reservations, sort_keys=True),
        }

    def tagged(self, cluster: str) -> dict[str, list[str]]:
        """Everything in moto still tagged for the cluster and alive (the `down` acceptance check)."""
        ec2, cfn, eks = self.client("ec2"), self.client("cloudformation"), self.client("eks")
        out: dict[str, list[str]] = {}
        out["clusters"] = [c for c in eks.list_clusters()["clusters"] if c == cluster]
        out["stacks"] = [s["StackName"] for s in cfn.list_stacks()["StackSummaries"]
                         if s["StackStatus"] != "DELETE_COMPLETE" and s["StackName"].startswith(f"eksctl-{cluster}-")]
        for key in ("raydlc.io/cluster", "eks:cluster-name"):
            flt = [{"Name": f"tag:{key}", "Values": [cluster]}]
            out.setdefault("instances", []).extend(
                i["InstanceId"] for r in ec2.describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]
                if i["State"]["Name"] not in ("terminated", "shutting-down"))
        flt = [{"Name": "tag:raydlc.io/cluster", "Values": [cluster]}]
        out["vpcs"] = [v["VpcId"] for v in ec2.describe_vpcs(Filters=flt)["Vpcs"]]
        out["subnets"] = [s["SubnetId"] for s in ec2.describe_subnets(Filters=flt)["Subnets"]]
        out["nat"] = [n["NatGatewayId"] for n in ec2.describe_nat_gateways()["NatGateways"]
                      if n["State"] in ("pending", "available")]
        out["eips"] = [a["AllocationId"] for a in ec2.describe_addresses()["Addresses"]]
        out["reservations"] = [r["CapacityReservationId"] for r in self.reservations if r["State"] == "active"]
        return {k: v for k, v in out.items() if v}


def _reservation_handlers(world: World) -> dict[str, Callable[..., Any]]:
    """moto has no EC2 capacity reservations: answer the two calls `down` makes from world.reservations.

    The request's parameters are recorded at before-parameter-build; before-call answers them.
    """
    from botocore.awsrequest import AWSResponse

    asked: dict[str, dict[str, Any]] = {}

    def record(op: str) -> Callable[..., None]:
        def handler(params: dict[str, Any], **kw: Any) -> None:
            asked[op] = dict(params)

        return handler

    def answer(parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("http://stub", 200, {}, None), {**parsed, "ResponseMetadata": {"HTTPStatusCode": 200}}

    def describe(**kw: Any) -> Any:
        params = asked["describe"]
        states = next((f["Values"] for f in params.get("Filters", []) if f["Name"] == "state"), ["active"])
        return answer({"CapacityReservations": [dict(r) for r in world.reservations if r["State"] in states]})

    def cancel(**kw: Any) -> Any:
        for r in world.reservations:
            if r["CapacityReservationId"] == asked["cancel"]["CapacityReservationId"]:
                r["State"] = "cancelled"
        return answer({"Return": True})

    return {
        "before-parameter-build.ec2.DescribeCapacityReservations": record("describe"),
        "before-call.ec2.DescribeCapacityReservations": describe,
        "before-parameter-build.ec2.CancelCapacityReservation": record("cancel"),
        "before-call.ec2.CancelCapacityReservation": cancel,
    }


def _without_aws_clis() -> list[str]:
    """PATH without `aws` and `aws-iam-authenticator`: a new user with only boto3 credentials has neither."""
    dirs = os.environ["PATH"].split(os.pathsep)
    return [d for d in dirs if not any(os.path.exists(os.path.join(d, t)) for t in ("aws", "aws-iam-authenticator"))]


@pytest.fixture
def world(moto_server: str, kube_server: KubeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[World]:
    import raydlc.edges.aws

    servers.reset_moto(moto_server, warm_regions=("us-east-2",))
    for k in list(os.environ):
        if k.startswith(("RAYDLC_", "AWS_", "DOUBLES_", "KUBECONFIG", "HF_")):
            monkeypatch.delenv(k)
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    servers.install_doubles(bin_dir, sys.executable)
    w = World(tmp_path, moto_server, kube_server, monkeypatch, tmp_path / "calls.jsonl", tmp_path / "scenario.json")
    w.scenario_file.write_text("{}")
    env = {
        "AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1", "HOME": str(home),
        "PATH": os.pathsep.join([str(bin_dir), *_without_aws_clis()]),
        "DOUBLES_LOG": str(w.log), "DOUBLES_SCENARIO": str(w.scenario_file), "DOUBLES_KUBE_URL": kube_server.url,
        # The scenarios are the fixed-size cluster (GPU nodes and workers always there); the default,
        # autoscaling one (IDLE_MINUTES=15) has its own: tests/lifecycle/test_autoscaler.py.
        "RAYDLC_IDLE_MINUTES": "0",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    hooks = _reservation_handlers(w)
    make = raydlc.edges.aws.client

    def moto_iam() -> Any:  # moto's own keys: the simulator reads the policies, whoever the caller is
        import boto3

        return boto3.client("iam", region_name="us-east-1", endpoint_url=moto_server, aws_access_key_id="testing",
                            aws_secret_access_key="testing")

    hooks.update(iam_simulator.handlers(moto_iam, w.simulations))
    hooks.update(eks_state.handlers(eks_state.path_for(w.scenario_file)))  # add-ons and pod identities: moto has neither

    def record(model: Any, params: dict[str, Any], **kw: Any) -> None:  # raydlc's clients' operations, while recording
        if w.operations is None:
            return
        service, name = model.service_model.signing_name, model.name
        if name == "DeleteObjects":  # authorised per key: s3:DeleteObjectVersion for a key with a VersionId
            kinds = {"DeleteObjectVersion" if "VersionId" in o else "DeleteObject" for o in params["Delete"]["Objects"]}
            w.operations.extend((service, k) for k in sorted(kinds))
        else:
            w.operations.append((service, name))

    hooks["before-parameter-build"] = record

    monkeypatch.setattr(raydlc.edges.aws, "client", awsstub.hooked(make, hooks))
    with Operator(kube_server.url) as op:
        w.operator = op  # type: ignore[attr-defined]
        yield w
    assert not op.errors, op.errors[:3]
