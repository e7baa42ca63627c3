"""Capacity: where the GPU node group goes (up), and raydlc's capacity reservations (down).

`up` decides the GPU Availability Zone once per run — the existing node group's, else GPU_AZ, else
the best zone of capacity discovery (`raydlc.capacity.choice`, pure) — as a frozen ZoneChoice that
the cluster (its AZs) and the GPU node group (its AZ, and where to go next on a capacity failure)
receive. `down` cancels the reservations `raydlc capacity --probe` or a user made for the cluster,
which bill until cancelled.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from raydlc.capacity.choice import ZoneChoice, choose, existing_choice
from raydlc.edges import aws
from raydlc.lifecycle import cloud, nodegroups
from raydlc.lifecycle.resource import Resource, gone
from raydlc.lifecycle.types import Observation, StepFailed, StepPlan

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context

READS = ("raydlc capacity (reads: ec2:DescribeInstanceTypeOfferings, ec2:DescribeInstanceTypes, "
         "servicequotas:GetServiceQuota, ec2:GetSpotPlacementScores, ec2:DescribeSpotPriceHistory, eks:DescribeCluster)")


class Capacity(Resource):
    name = "capacity"
    scope = "aws"
    fact = "the GPU capacity (Ready GPU nodes, NodePools, node groups at zero)"
    summary = "choose the GPU Availability Zone"
    removal = "raydlc's capacity reservations"

    def found(self, ctx: Context) -> Observation:
        from raydlc.lifecycle import attach

        return attach.found_capacity(ctx)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._choice: ZoneChoice | None = None

    def choice(self, ctx: Context) -> ZoneChoice:
        """This run's ZoneChoice, decided on first ask (from any step's thread) and the same ever after."""
        with self._lock:
            if self._choice is None:
                self._choice = self._decide(ctx)
            return self._choice

    def _decide(self, ctx: Context) -> ZoneChoice:
        cfg = ctx.cfg
        desc = cloud.cluster(ctx.aws("eks"), cfg.cluster.name)
        ng = nodegroups.describe(ctx, cfg.gpu_nodes.nodegroup_name) if desc is not None else None
        if ng is not None and ng.get("status") not in nodegroups.FAILED:
            az = nodegroups.zone_of(ctx, ng)
            if az is not None:
                subnets = (desc or {}).get("resourcesVpcConfig", {}).get("subnetIds") or []
                return existing_choice(cfg, az, set(cloud.subnet_zones(ctx.aws("ec2"), subnets).values()))
        from raydlc import capacity

        return choose(cfg, capacity.discover(cfg))

    # ------------------------------------------------------------------ up: the zone

    def look(self, ctx: Context) -> Observation:
        choice = self.choice(ctx)
        return Observation("ready" if choice.zone is not None else "degraded", choice.reason)

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        return StepPlan("none" if obs.state == "ready" else "blocked", obs.reason, (READS,))

    def ensure(self, ctx: Context, obs: Observation) -> None:
        """Only reached when no zone can take the node group: nothing to make, so say what to change."""
        raise StepFailed(obs.reason, hint=self.choice(ctx).hint
                         or "choose another REGION or GPU_NODE_TYPE (`raydlc capacity` shows each AZ)")

    def kept(self, ctx: Context) -> str:
        choice = self.choice(ctx)
        if choice.zone is None:
            raise StepFailed(choice.reason)
        return choice.reason

    # ------------------------------------------------------------------ down: the reservations

    def _reservations(self, ctx: Context) -> list[dict[str, Any]]:
        return cloud.capacity_reservations(ctx.aws("ec2"), ctx.cfg.cluster.name)

    def left(self, ctx: Context) -> Observation:
        try:
            found = self._reservations(ctx)
        except aws.UnsupportedError as e:
            return Observation("unknown", f"capacity reservations cannot be listed here ({e.message})")
        if not found:
            return gone("no capacity reservation of raydlc is active")
        return Observation("ready", f"{len(found)} raydlc capacity reservation(s) active",
                           {"ids": [r["CapacityReservationId"] for r in found]})

    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state != "ready":
            return StepPlan("none", obs.reason)
        return StepPlan("delete", obs.reason, tuple(f"ec2:CancelCapacityReservation {i}" for i in obs.facts["ids"]))

    def remove(self, ctx: Context, obs: Observation) -> None:
        ec2 = ctx.aws("ec2")
        for rid in obs.facts["ids"]:
            aws.call(ec2, "cancel_capacity_reservation", CapacityReservationId=rid)
            ctx.note(self.name, f"cancelled capacity reservation {rid}")

    def cleared(self, ctx: Context) -> str:
        try:
            left = self._reservations(ctx)
        except aws.UnsupportedError as e:
            return f"not verifiable: {e.message}"
        if left:
            ids = " ".join(r["CapacityReservationId"] for r in left)
            raise StepFailed(f"capacity reservations still active: {ids}",
                             hint=f"aws ec2 cancel-capacity-reservation --capacity-reservation-id <id> "
                             f"--region {ctx.cfg.cluster.region}")
        return "no raydlc capacity reservation active"
