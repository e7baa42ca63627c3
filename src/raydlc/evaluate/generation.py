"""Text from a model as its users will get it: the prompt through the export's chat template (with `chat`), greedy
or sampled, on the CPU or one GPU; the answer cut at the template's end of turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raydlc.data.formats import END_OF_TURN  # where raydlc's default template ends each turn


@dataclass(frozen=True)
class Sampling:
    """Greedy when `temperature` is 0; else sampled with `top_p`, seeded so a rerun gives the same text."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 0.95
    seed: int = 0


def prompt_text(tok: Any, prompt: str, *, chat: bool) -> str:
    """The text the model is given: with `chat`, a user turn and the assistant's generation prompt."""
    if not chat:
        return prompt
    return str(tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True))


def generate(model: Any, tok: Any, prompts: Sequence[str], *, chat: bool, sampling: Sampling) -> list[str]:
    """One completion per prompt (the new text only), one prompt at a time: no padding to get wrong."""
    import torch

    device = next(model.parameters()).device
    out = []
    for prompt in prompts:
        text = prompt_text(tok, prompt, chat=chat)
        ids = tok(text, return_tensors="pt", add_special_tokens=not chat).input_ids.to(device)
        if ids.shape[1] == 0:
            ids = torch.tensor([[tok.eos_token_id]], device=device)
        torch.manual_seed(sampling.seed)
        kw: dict[str, Any] = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p} if sampling.temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=sampling.max_new_tokens,
                                 pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id, **kw)[0, ids.shape[1]:]
        answer = tok.decode(new, skip_special_tokens=True)
        out.append(answer.split(END_OF_TURN)[0] if chat else answer)
    return out
