"""A dollar budget per run (JOB_MAX_COST_USD): the time it buys at the list price of the GPU nodes
the run occupies, when the loop must stop to finish inside it, what has been spent and what the
remaining steps would cost. Pure: numbers in, numbers out.

The price is the catalogue's On-Demand list price (raydlc.capacity's table, one region, one
date), never the bill: discounts and other regions differ; a Spot run (GPU_CAPACITY_TYPE spot, or
spot-then-on-demand on a Spot node group) is priced at the Spot price read when it is submitted (`prices_at`). Only the GPU nodes count: the
system node and the EKS control plane run whether or not a job does. A run with no price (a
local Ray, an instance type the table lacks) cannot honour a budget and refuses it before it starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from raydlc.errors import InputError

# What a run on a cluster costs before its first optimizer step, stated: worker processes start,
# the weights load shard by shard, the first step compiles and warms the allocator. A budget that
# cannot buy this plus one step is refused before submission.
STARTUP_ESTIMATE_S = 180.0
# Held back from the budget's time for the last checkpoint and the export, at least: the loop
# also keeps twice the slowest checkpoint it has measured (a checkpoint, then the export).
FINISH_SHARE = 0.05
PRICE_LABEL = "On-Demand list price"
SPOT_LABEL = "Spot price read at submit"  # GPU_USD_PER_HOUR, set by `submit` for Spot nodes


class Budget(BaseModel):
    """What a worker needs to stop in time: the dollars, the price they are spent at, and when the clock started."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd: float
    usd_per_hour: float
    started_at: float  # epoch seconds: when the driver began the run
    nodes: int
    instance_type: str | None = None  # None: a price given by the caller (tests, a negotiated rate)
    price_label: str | None = None  # where the price came from when not the list (SPOT_LABEL); None: the list price's note

    @property
    def seconds(self) -> float:
        """How long the budget lasts at this price."""
        return seconds_for(self.usd, self.usd_per_hour)

    @property
    def deadline(self) -> float:
        """Epoch seconds at which the budget is spent."""
        return self.started_at + self.seconds

    def spent(self, now: float) -> float:
        return max(0.0, now - self.started_at) * self.usd_per_hour / 3600.0

    def reserve_s(self, checkpoint_s: float = 0.0) -> float:
        """Time kept for the finish: a share of the budget's time, or twice the slowest checkpoint seen."""
        return max(FINISH_SHARE * self.seconds, 2.0 * checkpoint_s)

    def must_stop(self, now: float, *, step_s: float, checkpoint_s: float = 0.0) -> bool:
        """After a step: would one more step, then the finish, pass the deadline? Then this step is the last."""
        return now + step_s + self.reserve_s(checkpoint_s) >= self.deadline


def seconds_for(usd: float, usd_per_hour: float) -> float:
    """Seconds `usd` buys at `usd_per_hour` (a zero price buys forever)."""
    return math.inf if usd_per_hour <= 0 else usd / usd_per_hour * 3600.0


def hourly_price(instance_type: str | None, nodes: int, prices: Mapping[str, float]) -> float | None:
    """The list price per hour of `nodes` nodes of `instance_type`, from `prices` (USD per instance-hour); None when unknown."""
    if not instance_type or instance_type not in prices:
        return None
    return prices[instance_type] * nodes


def list_prices() -> Mapping[str, float]:
    """The catalogue's list prices (raydlc.capacity's table): the default `prices` of a run."""
    from raydlc.facts.prices import HOURLY_USD_US_EAST_1

    return HOURLY_USD_US_EAST_1


def price_note() -> str:
    from raydlc.facts.prices import PLATFORM, PRICE_REGION, PRICES_AS_OF

    return f"{PRICE_LABEL}, {PLATFORM} {PRICE_REGION}, as of {PRICES_AS_OF}"


def prices_at(instance_type: str, usd_per_node_hour: float | None) -> Mapping[str, float]:
    """The run's `prices`: the list prices with the GPU type at the price it is bought at (a Spot run at the Spot
    price, read live by raydlc.capacity.prices); an unknown price leaves the list price (a budget that lasts less)."""
    if usd_per_node_hour is None:
        return list_prices()
    return {**list_prices(), instance_type: usd_per_node_hour}


def job_deadline_s(usd: float | None, usd_per_hour: float | None, ceiling_s: int) -> int:
    """A RayJob's activeDeadlineSeconds: the budget's time (whole seconds) when there is one, never above JOB_DEADLINE_S."""
    if usd is None or not usd_per_hour:
        return ceiling_s
    return max(1, min(ceiling_s, math.floor(seconds_for(usd, usd_per_hour))))


def check_budget(usd: float, usd_per_hour: float | None, *, step_s: float | None, where: str, startup_s: float = STARTUP_ESTIMATE_S,
                 label: str = PRICE_LABEL) -> None:
    """Refuse a budget that has no price to be spent at or that cannot buy the start-up plus one
    step (the planner's step time when known). Before submission the start-up is STARTUP_ESTIMATE_S;
    the driver, once Ray has answered, checks again with the time it has already spent."""
    if usd_per_hour is None:
        raise InputError(
            f"JOB_MAX_COST_USD={usd:g}: {where} has no hourly price, so a dollar budget cannot be kept",
            hint="a budget applies to runs on the cluster's GPU nodes (their list price); leave JOB_MAX_COST_USD empty here",
        )
    need_s = startup_s + (step_s or 0.0)
    need = need_s * usd_per_hour / 3600.0
    if usd < need:
        step = f" + one step ({step_s:.1f} s, the planner's estimate)" if step_s else ""
        startup_note = ", an estimate" if startup_s == STARTUP_ESTIMATE_S else " so far"
        raise InputError(
            f"JOB_MAX_COST_USD={usd:g} is less than one step costs: ${need:.2f} buys the start-up ({startup_s:.0f} s{startup_note}){step} "
            f"at ${usd_per_hour:.2f}/h ({where}, {label})",
            hint=f"give at least --max-cost {math.ceil(need * 100) / 100:.2f}",
        )


@dataclass(frozen=True)
class Spend:
    """Spend so far and the forecast to the last step, at the budget's price."""

    budget_usd: float
    usd_per_hour: float
    spent_usd: float
    forecast_usd: float | None  # spent so far plus the remaining steps at the measured step time
    elapsed_s: float

    def to_dict(self) -> dict[str, float | None]:
        return {"budget_usd": self.budget_usd, "usd_per_hour": self.usd_per_hour, "spent_usd": round(self.spent_usd, 4),
                "forecast_usd": None if self.forecast_usd is None else round(self.forecast_usd, 4), "elapsed_s": round(self.elapsed_s, 3)}


def spend(budget: Budget, now: float, *, step: int, steps: int, step_s: float | None) -> Spend:
    """What the run has cost at `now`, and what it would cost to reach `steps` at `step_s` a step."""
    spent = budget.spent(now)
    forecast = None if step_s is None else spent + max(0, steps - step) * step_s * budget.usd_per_hour / 3600.0
    return Spend(budget.usd, budget.usd_per_hour, spent, forecast, max(0.0, now - budget.started_at))


def stop_reason(budget: Budget, *, step: int, spent_usd: float) -> str:
    """`stopped by the budget: $4.10 of $5.00 at step 37` — the summary's line."""
    return f"stopped by the budget: ${spent_usd:.2f} of ${budget.usd:.2f} at step {step}"


@dataclass(frozen=True)
class BudgetClock:
    """The loop's budget: asked after a step, it looks ahead as many steps as until it is asked
    again (`ahead`), at the last read step time, else at the attempt's mean so far."""

    budget: Budget
    ahead: int
    start_step: int  # the step the attempt continued after
    began: float  # perf_counter when the attempt's first step began

    def must_stop(self, step: int, history: Sequence[Mapping[str, Any]], *, now: float, perf: float, checkpoint_s: float) -> bool:
        per_step = next((r["step_time_s"] for r in reversed(history) if "step_time_s" in r), (perf - self.began) / (step - self.start_step))
        return self.budget.must_stop(now, step_s=per_step * self.ahead, checkpoint_s=checkpoint_s)

    def stopped(self, step: int, now: float) -> dict[str, str]:
        """The summary's record of the stop: by what, and the line saying why."""
        return {"stopped_by": "budget", "stop_reason": stop_reason(self.budget, step=step, spent_usd=self.budget.spent(now))}
