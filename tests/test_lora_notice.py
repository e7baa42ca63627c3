"""LoRA on a built-in spec at random init is said before the run: its frozen random base limits the fall."""

from __future__ import annotations

import pytest

from raydlc.api._train import _lora_base_note
from raydlc.config import TrainConfig


def test_lora_on_a_random_init_spec_gets_a_note_naming_the_way_out() -> None:
    note = _lora_base_note(TrainConfig(model_id="tiny", lora_rank=8))
    assert note is not None and "random init" in note and "--model DIR" in note


@pytest.mark.parametrize("settings", [{"model_id": "tiny", "lora_rank": 0}, {"model_id": "Qwen/Qwen2.5-1.5B", "lora_rank": 8}])
def test_no_note_for_full_fine_tuning_or_a_pretrained_base(settings: dict[str, object]) -> None:
    assert _lora_base_note(TrainConfig(**settings)) is None


def test_the_view_prints_the_notice_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.views.progress import TrainView

    with TrainView(quiet=True, debug=False) as view:
        view({"stage": "notice", "text": "the base is random"})
    captured = capsys.readouterr()
    assert "note: the base is random" in captured.err and captured.out == ""
