"""One record of a dataset to the segments the model reads, each marked with whether it carries the loss.

The formats people have: `{"text": …}`; `{"prompt": …, "response"|"completion": …}`;
`{"messages": [{"role", "content"}, …]}` (OpenAI style) and ShareGPT's
`{"conversations": [{"from", "value"}, …]}`. A conversation is rendered with the model's chat
template where its tokenizer has one (`Renderer`), else with the default below, in which each
turn is `<|im_start|>ROLE\\n` + content + `<|im_end|>\\n`. With `loss_on="assistant"` only the
assistant turns (and a response) carry the loss; with `"all"` everything does. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

LossOn = Literal["assistant", "all"]
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "tool": "tool", "function": "tool", "observation": "tool"}
DEFAULT_TEMPLATE = "default"
HINT = ('each record needs "text", "prompt" with "response" (or "completion"), "messages" '
        '([{"role", "content"}]) or "conversations" ([{"from", "value"}]), with string values')


class BadRecord(ValueError):
    """A record that cannot be used; the message says why, the caller adds where."""


@dataclass(frozen=True)
class Segment:
    text: str
    learn: bool


Message = tuple[str, str]  # (role, content)
# A chat renderer: the conversation's turns -> segments (text, learn), given which turns carry the loss.
Renderer = Callable[[Sequence[Message], LossOn], list[Segment]]


def default_render(messages: Sequence[Message], loss_on: LossOn) -> list[Segment]:
    """The documented default template: a role header the loss never sees, then the turn."""
    out: list[Segment] = []
    for role, content in messages:
        out.append(Segment(f"<|im_start|>{role}\n", loss_on == "all"))
        out.append(Segment(f"{content}<|im_end|>\n", loss_on == "all" or role == "assistant"))
    return out


# `default_render` as a Hugging Face chat template (Jinja): what the export's tokenizer carries when the data
# was rendered with the default, so `apply_chat_template` gives the text the model trained on (no EOS: packing adds it).
END_OF_TURN = "<|im_end|>"
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def segments(rec: Any, *, loss_on: LossOn = "assistant", render: Renderer = default_render) -> list[Segment]:
    """The record's segments; `BadRecord` says what is wrong with it."""
    if not isinstance(rec, Mapping):
        raise BadRecord(f"expected a JSON object, got {type(rec).__name__}")
    if "messages" in rec or "conversations" in rec:
        return render(conversation(rec), loss_on)
    if "prompt" in rec or "response" in rec or "completion" in rec:
        answer_key = "completion" if "completion" in rec and "response" not in rec else "response"
        prompt, response = rec.get("prompt"), rec.get(answer_key)
        missing = [k for k, v in (("prompt", prompt), (answer_key, response)) if not isinstance(v, str)]
        if missing:
            raise BadRecord(f"field(s) {', '.join(missing)} missing or not a string")
        assert isinstance(prompt, str) and isinstance(response, str)
        if not response.strip():
            raise BadRecord(f"empty {answer_key} (nothing to learn)")
        return ([Segment(prompt, loss_on == "all")] if prompt else []) + [Segment(response, True)]
    text = rec.get("text")
    if isinstance(text, str) and text.strip():
        return [Segment(text, True)]
    if "text" in rec:
        raise BadRecord("'text' is empty or not a string")
    raise BadRecord(f"no 'text', 'prompt'/'response' or 'messages' field (found {sorted(map(str, rec))})")


def conversation(rec: Mapping[str, Any]) -> list[Message]:
    """`messages` or `conversations` as (role, content) turns, every turn checked."""
    sharegpt = "messages" not in rec
    turns = rec["conversations" if sharegpt else "messages"]
    role_key, content_key = ("from", "value") if sharegpt else ("role", "content")
    if not isinstance(turns, list) or not turns:
        raise BadRecord(f"'{'conversations' if sharegpt else 'messages'}' must be a non-empty list of turns")
    out: list[Message] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise BadRecord(f"turn {i} is not an object")
        role, content = turn.get(role_key), turn.get(content_key)
        role = SHAREGPT_ROLES.get(role) if sharegpt and isinstance(role, str) else role
        if role not in ROLES:
            known = ", ".join(SHAREGPT_ROLES if sharegpt else ROLES)
            raise BadRecord(f"turn {i}: unknown role {turn.get(role_key)!r} (known: {known})")
        if not isinstance(content, str):
            raise BadRecord(f"turn {i}: '{content_key}' missing or not a string")
        if role == "assistant" and not content.strip():
            raise BadRecord(f"turn {i}: empty assistant turn")
        out.append((role, content))
    if not any(role == "assistant" for role, _ in out):
        raise BadRecord("no assistant turn (nothing to learn)")
    return out


def template_render(apply: Callable[..., str]) -> Renderer:
    """A renderer from a chat template (`apply(messages, add_generation_prompt=…)` -> text).

    Each assistant turn is found by rendering the conversation up to it twice: with the
    generation prompt (what the model is given) and with the turn (what it must produce); the
    difference carries the loss. A template whose renderings are not each other's prefixes
    cannot be split this way and is refused.
    """

    def render(messages: Sequence[Message], loss_on: LossOn) -> list[Segment]:
        dicts = [{"role": r, "content": c} for r, c in messages]
        out: list[Segment] = []
        done = ""
        for i, (role, _) in enumerate(messages):
            if role != "assistant":
                continue
            given = apply(dicts[:i], add_generation_prompt=True)
            full = apply(dicts[: i + 1], add_generation_prompt=False)
            if not (given.startswith(done) and full.startswith(given)):
                raise BadRecord("the model's chat template does not render turn by turn (a prefix changes); use --chat-template default")
            out += [Segment(given[len(done):], loss_on == "all"), Segment(full[len(given):], True)]
            done = full
        rest = apply(dicts, add_generation_prompt=False)
        if not rest.startswith(done):
            raise BadRecord("the model's chat template does not render turn by turn (a prefix changes); use --chat-template default")
        if rest[len(done):]:
            out.append(Segment(rest[len(done):], loss_on == "all"))
        return [s for s in out if s.text]

    return render
