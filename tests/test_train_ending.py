"""The run's end (train.ending): steps run in order, each sees what the earlier ones added, a failure is a warning."""

from __future__ import annotations

from raydlc.api._train import TrainResult
from raydlc.train import ending


def test_steps_run_in_order_and_see_what_earlier_steps_added() -> None:
    seen: list[str] = []

    def evaluate(end: ending.RunEnd) -> dict:
        seen.append("eval")
        return {"eval": {"perplexity": 12.5}}

    def card(end: ending.RunEnd) -> dict:
        seen.append("card")
        return {"card": f"ppl {end.summary['eval']['perplexity']}"}

    out = ending.finish(None, {"steps": 3}, steps=[("eval", evaluate), ("card", card)])  # type: ignore[arg-type]
    assert seen == ["eval", "card"]
    assert out == {"steps": 3, "eval": {"perplexity": 12.5}, "card": "ppl 12.5"}


def test_a_failing_step_is_a_warning_and_the_next_still_runs() -> None:
    def broken(end: ending.RunEnd) -> dict:
        raise OSError("tracker unreachable")

    out = ending.finish(None, {"steps": 3}, steps=[("mlflow", broken), ("card", lambda end: {"card": "ok"})])  # type: ignore[arg-type]
    assert out["card"] == "ok"
    assert out["end_warnings"] == ["mlflow: OSError: tracker unreachable"]


def test_the_summary_without_warnings_keeps_its_json_shape() -> None:
    fields = {f: None for f in TrainResult.__dataclass_fields__ if f not in ("restarts", "end_warnings", "preflight")}
    assert "end_warnings" not in TrainResult(**fields).to_dict()
    assert TrainResult(**fields, end_warnings=["card: x"]).to_dict()["end_warnings"] == ["card: x"]
