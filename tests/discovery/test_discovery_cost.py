"""Prices of the found nodes: from the one table, "unknown" (never $0) when it has none, Spot from the labels."""

from __future__ import annotations

from typing import Any

import platform_world as pw
import pytest

from raydlc.discovery.cost import price, spot_nodes, target_price
from raydlc.discovery.gather import gather
from raydlc.discovery.read import capacity_type, discover
from raydlc.discovery.target import pick
from raydlc.errors import InputError
from raydlc.facts.prices import HOURLY_USD_US_EAST_1
from raydlc.planner.budget import check_budget


def test_a_type_in_the_table_is_priced_from_it() -> None:
    p = price("g6.12xlarge")
    assert p.usd_per_hour == HOURLY_USD_US_EAST_1["g6.12xlarge"] and p.text().startswith("$4.60/h per node")


@pytest.mark.parametrize("itype", ["ml.p5.48xlarge", "g4dn.12xlarge", "x9.huge"])
def test_a_type_without_a_price_is_unknown_never_zero(itype: str) -> None:
    p = price(itype)
    assert p.usd_per_hour is None and p.text().startswith("unknown price (")
    with pytest.raises(InputError):
        check_budget(10.0, p.usd_per_hour, step_s=None, where=itype)  # a dollar budget on it is refused
    assert price("g6.12xlarge", prices={"g6.12xlarge": 0.0}).usd_per_hour is None  # a zero in a table is no price


def test_capacity_type_labels_of_eks_and_karpenter() -> None:
    assert capacity_type({"eks.amazonaws.com/capacityType": "SPOT"}) == "spot"
    assert capacity_type({"eks.amazonaws.com/capacityType": "ON_DEMAND"}) == "on-demand"
    assert capacity_type({"karpenter.sh/capacity-type": "spot"}) == "spot"
    assert capacity_type({"eks.amazonaws.com/capacityType": "CAPACITY_BLOCK"}) == "capacity-block"
    assert capacity_type({}) is None


def test_spot_nodes_found_are_priced_as_an_upper_bound(platform: Any, user_kube: Any) -> None:
    f = discover(gather(user_kube, pw.NAMESPACE))
    assert spot_nodes(f) is False
    platform.kube.patch("Node", "gpu-0", {"metadata": {"labels": {"eks.amazonaws.com/capacityType": "SPOT"}}})
    f = discover(gather(user_kube, pw.NAMESPACE))
    assert spot_nodes(f) is True
    p = target_price(pick(f))
    assert p.spot and p.usd_per_hour == HOURLY_USD_US_EAST_1["g6.12xlarge"] and "upper bound" in p.note


@pytest.mark.parametrize("platform", ["hyperpod"], indirect=True)
def test_hyperpod_nodes_have_an_unknown_price(platform: Any, user_kube: Any) -> None:
    p = target_price(pick(discover(gather(user_kube, pw.NAMESPACE))))
    assert p.usd_per_hour is None and "SageMaker" in p.note
