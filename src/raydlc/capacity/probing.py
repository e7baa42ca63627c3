"""The definitive check: hold a real On-Demand Capacity Reservation for an instant, never leave one behind."""

from __future__ import annotations

import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from raydlc import aws
from raydlc.capacity.ranking import ProbeResult
from raydlc.errors import AwsError, RaydlcError

PROBE_TAG = "raydlc:capacity-probe"
PLATFORM = "Linux/UNIX"



# On-Demand Linux list prices, USD per instance-hour, us-east-1 (other regions differ by
# a few to ~30 %). A table, not the Pricing API: the probe must state the cost even when
# pricing:GetProducts is not granted. Types missing here report no price.
HOURLY_USD_US_EAST_1: dict[str, float] = {
    "g5.12xlarge": 5.672,
    "g5.24xlarge": 8.144,
    "g5.48xlarge": 16.288,
    "g6.12xlarge": 4.6016,
    "g6.24xlarge": 6.6752,
    "g6.48xlarge": 13.3504,
    "g6e.12xlarge": 10.49264,
    "g6e.24xlarge": 15.06559,
    "g6e.48xlarge": 30.13118,
    "p4d.24xlarge": 21.96,
    "p5.48xlarge": 55.04,
    "m7i.xlarge": 0.2016,
}
PRICE_SOURCE = "raydlc's built-in table of us-east-1 On-Demand Linux list prices (approximate elsewhere)"



class ProbeInterrupted(RaydlcError):
    """Interrupted during the probe; raised only after the reservation was cancelled."""

    exit_code = 130


class ReservationLeftBehind(AwsError):
    """A probe reservation could not be cancelled: it costs money until someone does."""


_INSUFFICIENT = ("InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientReservedInstanceCapacity")


def hourly_cost(instance_type: str, count: int) -> float | None:
    price = HOURLY_USD_US_EAST_1.get(instance_type)
    return None if price is None else round(price * count, 4)


@contextmanager
def _deferred_signals(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM for the window between create and cancel; yields what arrived.

    The default SIGINT handler raises KeyboardInterrupt wherever Python happens to be, which
    can lose a reservation id between AWS answering and the assignment. Only the main thread
    may install handlers; elsewhere the window is covered by `finally` and the tag sweep.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.getsignal(s) for s in signums}

    def hold(signum: int, frame: Any) -> None:
        if not received:
            sys.stderr.write("raydlc: cancelling the probe's capacity reservation before stopping…\n")
        received.append(signum)

    for s in signums:
        signal.signal(s, hold)
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _cancel(ec2: Any, reservation_id: str, region: str) -> None:
    try:
        aws.call(ec2, "cancel_capacity_reservation", CapacityReservationId=reservation_id)
    except RaydlcError as e:
        raise ReservationLeftBehind(
            f"capacity reservation {reservation_id} in {region} could NOT be cancelled ({e.message}); "
            "it is billed until cancelled",
            hint=f"aws ec2 cancel-capacity-reservation --capacity-reservation-id {reservation_id} --region {region}",
        ) from e


def _sweep(ec2: Any, token: str, region: str) -> list[str]:
    """Reservations this probe created whose id never reached us (interrupted mid-call)."""
    try:
        out = aws.call(
            ec2, "describe_capacity_reservations",
            Filters=[{"Name": f"tag:{PROBE_TAG}", "Values": [token]}, {"Name": "state", "Values": ["active", "pending"]}],
        )
    except RaydlcError as e:
        raise ReservationLeftBehind(
            f"the probe's create was cut off and its reservation could not be looked up ({e.message}); "
            "one may be active and billed",
            hint=f"aws ec2 describe-capacity-reservations --region {region} --filters Name=tag:{PROBE_TAG},Values={token}",
        ) from e
    return [r["CapacityReservationId"] for r in out.get("CapacityReservations", [])]


def probe(ec2: Any, *, region: str, zone: str, instance_type: str, count: int) -> ProbeResult:
    """Reserve count × type in `zone` for an instant, then cancel; no reservation outlives this call.

    A DryRun first proves the permission without creating anything. The create carries a
    ClientToken and a tag, so a create whose answer was lost can still be found and cancelled.
    """
    params = dict(
        InstanceType=instance_type, InstancePlatform=PLATFORM, AvailabilityZone=zone, InstanceCount=count,
        InstanceMatchCriteria="targeted", EndDateType="unlimited", Tenancy="default",
    )
    try:
        dry = aws.call(ec2, "create_capacity_reservation", DryRun=True, **params)
    except aws.AwsCallError as e:
        if e.code != "DryRunOperation":
            raise
    else:
        rid = dry.get("CapacityReservation", {}).get("CapacityReservationId")
        if rid:
            _cancel(ec2, rid, region)
        raise aws.UnsupportedError(
            "ec2 CreateCapacityReservation ignored DryRun=True; refusing to probe against this endpoint"
            + (f" (reservation {rid} it created was cancelled)" if rid else ""),
            hint="check `aws ec2 describe-capacity-reservations` for leftovers",
        )

    token = uuid.uuid4().hex
    price = hourly_cost(instance_type, count)
    reservation_id: str | None = None
    answered = False  # AWS gave a definitive answer to the create, so nothing can be unaccounted for
    outcome: Literal["available", "insufficient-capacity"] = "available"
    message = ""
    with _deferred_signals() as received:
        try:
            out = aws.call(
                ec2, "create_capacity_reservation", ClientToken=token,
                TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": [{"Key": PROBE_TAG, "Value": token}]}],
                **params,
            )
            reservation_id = out["CapacityReservation"]["CapacityReservationId"]
            answered = True
        except aws.AwsCallError as e:
            answered = e.code is not None
            if e.code not in _INSUFFICIENT:
                raise
            outcome, message = "insufficient-capacity", f"AWS has no {count} × {instance_type} in {zone} right now ({e.code})"
        finally:
            if reservation_id:
                _cancel(ec2, reservation_id, region)
            elif not answered:
                found = _sweep(ec2, token, region)
                for rid in found:
                    _cancel(ec2, rid, region)
                reservation_id = found[0] if found else None
    cost = "" if price is None else f"; held, it would have cost ${price:,.2f}/h"
    if received:
        raise ProbeInterrupted(
            f"interrupted during the capacity probe; reservation {reservation_id or '(none created)'} was cancelled{cost}"
        )
    if outcome == "available":
        message = f"reserved {count} × {instance_type} in {zone} and cancelled it at once{cost}"
    return ProbeResult(zone, instance_type, count, outcome, reservation_id, reservation_id is not None, price, PRICE_SOURCE, message)


