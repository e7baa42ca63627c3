"""Tokenizers: the model's own when it has one, else a byte-level BPE trained on the spot.

The tiny local model has no published tokenizer and the machine may be offline, so one is
trained on the training text itself (a second or so for the bundled corpus) and shipped with
the export. Training is deterministic for the same documents, which keeps resumed runs and
1-vs-2-worker comparisons on identical token ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raydlc.errors import InputError

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class TokenizerInfo:
    """What workers and the export need: the serialized tokenizer (or where to load it), EOS."""

    eos_id: int
    vocab_size: int
    tokenizer_json: str | None = None  # trained here; shipped inline
    pretrained: str | None = None  # a hub id or local dir that holds the model's own tokenizer
    template: str = "default"  # the chat template the data was rendered with: "model" (the tokenizer's own) or "default"


def train_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE (so every input is encodable) with one special token, EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def for_model(model_id: str, texts: list[str], vocab_size: int, *, has_own: bool) -> tuple[TokenizerInfo, Any]:
    """(info, a `tokenizers.Tokenizer`-like object with `encode_batch`) for the run."""
    if not has_own:
        tok = train_bpe(texts, vocab_size)
        return TokenizerInfo(eos_id=tok.token_to_id(EOS), vocab_size=tok.get_vocab_size(), tokenizer_json=tok.to_str()), tok
    hf = load_pretrained_tokenizer(model_id)
    eos = hf.eos_token_id
    if eos is None:
        raise InputError(f"the tokenizer of {model_id!r} has no EOS token", hint="use a causal-LM tokenizer")
    return TokenizerInfo(eos_id=int(eos), vocab_size=len(hf), pretrained=model_id), hf.backend_tokenizer


def load_pretrained_tokenizer(model_id: str) -> Any:
    import os

    from transformers import AutoTokenizer

    from raydlc.facts.models import model_dir

    local = model_dir(model_id)  # a directory, or the hub id's entry in the local hub cache
    if local is None and os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        raise InputError(f"tokenizer of {model_id!r}: a hub id while HF_HUB_OFFLINE is set", hint="use a local model directory")
    try:
        return AutoTokenizer.from_pretrained(str(local) if local is not None else model_id)
    except OSError as e:
        raise InputError(f"cannot load the tokenizer of {model_id!r}: {e}", hint="set HF_HUB_OFFLINE=1 without network") from e


def encoder(tok: Any) -> Any:
    """`list[str] -> list[list[int]]` without special tokens (EOS is placed by packing)."""

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    return encode


def to_hf(info: TokenizerInfo, *, max_length: int | None = None) -> Any:
    """A transformers tokenizer to save beside the exported weights, complete for the tools that read it: the chat
    template the data was rendered with (the model's own, or raydlc's default) and a finite `model_max_length`
    (`max_length`: the model's positions, where the tokenizer says none; transformers' "none" is 1e30)."""
    from raydlc.data.formats import DEFAULT_CHAT_TEMPLATE

    if info.pretrained is not None:
        tok = load_pretrained_tokenizer(info.pretrained)
    else:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        assert info.tokenizer_json is not None
        tok = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(info.tokenizer_json), eos_token=EOS, pad_token=EOS, bos_token=None, unk_token=None
        )
    if info.template != "model" or not getattr(tok, "chat_template", None):
        tok.chat_template = DEFAULT_CHAT_TEMPLATE
    if max_length is not None and not 0 < int(getattr(tok, "model_max_length", 0) or 0) <= max_length:
        tok.model_max_length = int(max_length)
    return tok
