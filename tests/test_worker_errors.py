"""Errors raised in a Ray Train worker reach the user as they were raised: a raydlc error keeps its
message, hint and exit code; anything else gives its last line and the rank. Real Ray Train v2
(the session's in-process local Ray), a worker function that raises."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from raydlc.edges import ray_runtime
from raydlc.errors import ConfigError, InputError, RaydlcError

pytestmark = pytest.mark.slow


def _fit(error: BaseException, rank: int = 0) -> BaseException:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def _raise_input_error(config: dict[str, Any]) -> None:  # nested: pickled by value, so no worker imports this test module
        import ray.train

        if ray.train.get_context().get_world_rank() == config["rank"]:
            raise config["error"]

    trainer = TorchTrainer(_raise_input_error, train_loop_config={"error": error, "rank": rank},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(failure_config=FailureConfig(max_failures=0)))
    with pytest.raises(Exception) as caught:
        trainer.fit()
    return caught.value


def test_a_raydlc_error_pickles_whole() -> None:
    for e in (InputError("model directory ./m does not exist", hint="pass an existing directory"),
              ConfigError(["STEPS (flag): must be at least 1, got 0", "SEQ_LEN (flag): must be at least 2"])):
        back = pickle.loads(pickle.dumps(e))
        assert (type(back), back.message, back.hint, back.exit_code, str(back)) == (type(e), e.message, e.hint, e.exit_code, str(e))
    assert pickle.loads(pickle.dumps(ConfigError(["a"]))).problems == ["a"]


def test_a_worker_input_error_keeps_its_message_hint_and_exit_code(ray_local: Any) -> None:
    raised = InputError("tokenizer of ./m has 5000 tokens, the model only 4096", hint="use the model's own tokenizer")
    err = ray_runtime.run_error(_fit(raised, rank=1), "training run r", "see the worker logs")
    assert isinstance(err, InputError) and err.exit_code == 2
    assert (err.message, err.hint) == (raised.message, raised.hint)


def test_another_worker_exception_gives_its_last_line_and_rank(ray_local: Any) -> None:
    err = ray_runtime.run_error(_fit(ZeroDivisionError("division by zero"), rank=1), "training run r", "see the worker logs")
    assert type(err) is not InputError and isinstance(err, RaydlcError) and err.exit_code == 1
    assert err.message == "training run r failed: rank 1: division by zero" and err.hint == "see the worker logs"
