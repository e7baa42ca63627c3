"""The held-out loss, as training measured it: next-token cross-entropy summed over the label tokens (IGNORE
elsewhere) of the run's eval rows, over their count; the perplexity is its exponential."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydlc.errors import InputError

MAX_ROWS = 64  # --data: the first rows of a prepared dataset, as many as a run holds out at most (data.order)


@dataclass(frozen=True)
class Score:
    loss: float
    perplexity: float
    tokens: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return {"loss": self.loss, "perplexity": self.perplexity, "tokens": self.tokens, "rows": self.rows}


def rows_of(dest: str, rows: Sequence[int] | None, *, masking: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(ids, labels, documents) of a prepared dataset's `rows` (None: its first MAX_ROWS), read as the workers
    read them: with `masking` (the run's DOCUMENT_MASKING), a packed block's documents are scored each alone,
    as training's eval loss scored them (data.documents)."""
    from raydlc.data import documents
    from raydlc.data.shards import Rows, read_manifest

    m = read_manifest(dest)
    if m is None:
        raise InputError(f"{dest}: not a prepared dataset (no manifest)", hint="prepare it with raydlc data prepare, or leave --data out")
    reader = Rows.open(dest, m)
    chosen = np.asarray(rows if rows is not None else range(min(MAX_ROWS, len(reader))), dtype=np.int64)
    if not len(chosen):
        raise InputError(f"{dest}: no rows to evaluate on")
    return documents.read(reader, chosen, masking=masking)


def score(model: Any, ids: np.ndarray, labels: np.ndarray, docs: np.ndarray | None = None, *, batch_size: int = 4) -> Score:
    """Mean next-token loss over the label tokens of these rows, in fp32; with `docs`, each token attends
    within its own document, positions restarting per document (data.documents)."""
    import torch
    import torch.nn.functional as F

    from raydlc.data.documents import model_inputs
    from raydlc.data.encode import IGNORE

    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids), batch_size):
            x = torch.as_tensor(ids[i : i + batch_size], dtype=torch.long, device=device)
            y = torch.as_tensor(labels[i : i + batch_size], dtype=torch.long, device=device)[:, 1:]
            extra = {} if docs is None else model_inputs(model, torch.as_tensor(docs[i : i + batch_size], device=device))
            logits = model(input_ids=x, **extra).logits[:, :-1].float()
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE, reduction="sum"))
            count += int((y != IGNORE).sum())
    if count == 0:
        raise InputError("the rows hold no label tokens to score")
    loss = total / count
    return Score(loss, math.exp(loss), count, len(ids))
