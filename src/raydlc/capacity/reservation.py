"""The definitive check: hold a real On-Demand Capacity Reservation for an instant, never leave one behind."""

from __future__ import annotations

import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from raydlc.capacity.ranking import ReservationResult
from raydlc.edges import aws
from raydlc.errors import AwsError, RaydlcError
from raydlc.facts.prices import PLATFORM, PRICE_SOURCE, hourly_cost

PROBE_TAG = "raydlc:capacity-probe"


class ReservationInterrupted(RaydlcError):
    """Interrupted while holding the reservation; raised only after the reservation was cancelled."""

    exit_code = 130


class ReservationLeftBehind(AwsError):
    """A probe reservation could not be cancelled: it costs money until someone does."""


_INSUFFICIENT = ("InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientReservedInstanceCapacity")


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


def hold_and_cancel(ec2: Any, *, region: str, zone: str, instance_type: str, count: int) -> ReservationResult:
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
        raise ReservationInterrupted(
            f"interrupted during the capacity probe; reservation {reservation_id or '(none created)'} was cancelled{cost}"
        )
    if outcome == "available":
        message = f"reserved {count} × {instance_type} in {zone} and cancelled it at once{cost}"
    return ReservationResult(zone, instance_type, count, outcome, reservation_id, reservation_id is not None, price, PRICE_SOURCE, message)


