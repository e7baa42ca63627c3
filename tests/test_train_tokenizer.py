"""The on-the-spot tokenizer of the tiny model: deterministic, small enough, shipped with the export."""

from __future__ import annotations

from pathlib import Path

from raydlc.data import tokenizer as T
from raydlc.data.corpus import bundled_corpus
from raydlc.facts.models import get_spec


def test_bpe_is_deterministic_fits_the_tiny_vocab_and_round_trips(tmp_path: Path) -> None:
    texts = [d.text for d in bundled_corpus(max_chars=300_000)]
    vocab = get_spec("tiny").vocab_size
    info_a, tok_a = T.for_model("tiny", texts, vocab, has_own=False)
    info_b, _ = T.for_model("tiny", texts, vocab, has_own=False)
    assert info_a == info_b
    assert info_a.vocab_size <= vocab and info_a.vocab_size > 1000
    assert info_a.eos_id == tok_a.token_to_id(T.EOS)
    sample = "Return a new list containing all items from the iterable in ascending order. ünïcode ✓"
    ids = T.encoder(tok_a)([sample])[0]
    assert len(ids) < len(sample) / 2  # merges were learned: fewer tokens than bytes
    assert info_a.eos_id not in ids
    hf = T.to_hf(info_a)
    assert hf.decode(ids) == sample
    hf.save_pretrained(str(tmp_path))
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(str(tmp_path))
    assert again(sample, add_special_tokens=False)["input_ids"] == ids
    assert again.eos_token == T.EOS
