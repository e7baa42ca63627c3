"""Document masking for packed blocks: each token sees its own document only, as if it were alone.

The packer concatenates records and cuts the stream into blocks, and the shards record each
token's document (data.shards). With DOCUMENT_MASKING on, a block's forward gets three things
from the documents: an attention mask that is causal AND same-document, position ids that
restart at 0 at each document's first token (RoPE sees what a lone document sees; torchtitan and
torchtune do the same for packed documents), and no loss on a document's first token, which
alone has nothing before it to be predicted from (the previous document's last token would
predict it). So a block's per-token losses are each document's alone (tests/test_documents.py).

The mask has one definition (`document_causal`, a FlexAttention `mask_mod`) and two forms:
on CUDA with COMPILE a FlexAttention `BlockMask` (`create_block_mask`; the model's attention is
switched to transformers' `flex_attention`, whose kernels skip the blocks the mask leaves out),
elsewhere a boolean [batch, 1, seq, seq] mask for SDPA. transformers takes either as a
ready 4-D mask (masking_utils: returned as is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from raydlc.data.encode import IGNORE

if TYPE_CHECKING:
    import torch
    from torch import nn


def starts(docs: np.ndarray) -> np.ndarray:
    """Where a document other than the row's first begins: [rows, seq] booleans."""
    out = np.zeros(docs.shape, dtype=bool)
    out[:, 1:] = docs[:, 1:] != docs[:, :-1]
    return out


def read(rows: Any, idx: np.ndarray, *, masking: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(ids, labels, documents) of these rows for the loop: documents None where masking is off or the
    shards record none (then a block is one document); with documents, each document's first token carries no loss."""
    ids, labels, docs = rows.take_documents(idx)
    if not masking or docs is None:
        return ids, labels, None
    return ids, np.where(starts(docs), IGNORE, labels), docs


def positions(docs: torch.Tensor) -> torch.Tensor:
    """Each token's index inside its document: 0 at every document's first token."""
    import torch

    idx = torch.arange(docs.shape[1], device=docs.device).expand_as(docs)
    first = torch.ones_like(docs, dtype=torch.bool)
    first[:, 1:] = docs[:, 1:] != docs[:, :-1]
    return idx - torch.where(first, idx, torch.zeros_like(idx)).cummax(dim=1).values


def document_causal(docs: torch.Tensor) -> Any:
    """The mask as a FlexAttention `mask_mod`: query q sees key kv when kv is not after q and both are in one document."""

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (kv <= q) & (docs[b, q] == docs[b, kv])

    return mask_mod


def dense_mask(docs: torch.Tensor) -> torch.Tensor:
    """`document_causal` as SDPA's boolean mask (True: attend), [batch, 1, seq, seq]."""
    import torch

    n = docs.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=docs.device).tril()
    return ((docs[:, :, None] == docs[:, None, :]) & causal)[:, None]


def block_mask(docs: torch.Tensor) -> Any:
    """`document_causal` as FlexAttention's `BlockMask` (its kernels skip the blocks it leaves out)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(document_causal(docs), docs.shape[0], None, docs.shape[1], docs.shape[1], device=docs.device)


FLEX = "flex_attention"


def use_flex(model: nn.Module, device: torch.device, *, compile: bool) -> bool:
    """On CUDA with COMPILE, attend through FlexAttention (before the first forward, which compiles the
    blocks); elsewhere SDPA with the dense mask. Returns whether it switched."""
    if device.type != "cuda" or not compile:
        return False
    model.config._attn_implementation = FLEX  # type: ignore[union-attr]
    return True


def model_inputs(model: nn.Module, docs: torch.Tensor) -> dict[str, Any]:
    """The forward's keyword arguments for a batch of packed documents: the mask in the model's attention's form, and the positions."""
    flex = getattr(model.config, "_attn_implementation", None) == FLEX
    return {"attention_mask": block_mask(docs) if flex else dense_mask(docs), "position_ids": positions(docs)}
