"""The shapes a setting can have, as annotations on its field: `Annotated[int, AtLeast(1)]`.

Nearly every rule of the Config tree is one of a few shapes (a count with a floor, a share
between two bounds, a DNS-1123 name, a string with a pattern, an empty value meaning "not
set"). Each shape is a small frozen value that a field carries in its annotation; the one
generic validator of `config._Section` finds them and applies them in order, after the rules
every field gets (no control characters, a ceiling on numbers). So a new field states its
rule in its type, and every message of a shape is written once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class Rule:
    """A check a field's annotation carries: `before` sees the raw input, `check` the parsed value."""

    def before(self, value: Any) -> Any:
        return value

    def check(self, value: Any) -> None:
        """Raise ValueError with the message a person reads (after `NAME (source): `)."""


@dataclass(frozen=True)
class AtLeast(Rule):
    """A number with a floor: `must be at least 20 GiB, got 5`; a floor of 0 reads `must be 0 or more`."""

    floor: float
    unit: str = ""
    why: str = ""

    def check(self, value: Any) -> None:
        if value is None or value >= self.floor:
            return
        if self.floor == 0:
            raise ValueError(f"must be 0 or more, got {value}")
        unit = f" {self.unit}" if self.unit else ""
        why = f" ({self.why})" if self.why else ""
        raise ValueError(f"must be at least {self.floor:g}{unit}{why}, got {value}")


@dataclass(frozen=True)
class Above(Rule):
    """A number strictly greater than a bound (a learning rate, a clipping norm)."""

    bound: float

    def check(self, value: Any) -> None:
        if not value > self.bound:
            raise ValueError(f"must be greater than {self.bound:g}, got {value}")


@dataclass(frozen=True)
class Between(Rule):
    """A number strictly inside two bounds (a share of the data)."""

    low: float
    high: float

    def check(self, value: Any) -> None:
        if not self.low < value < self.high:
            raise ValueError(f"must be between {self.low:g} and {self.high:g}, got {value}")


_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Dns1123(Rule):
    """A Kubernetes object name; `max_len` is shorter where KubeRay appends suffixes to it."""

    max_len: int = 63

    def check(self, value: Any) -> None:
        if not _DNS1123.match(value) or len(value) > self.max_len:
            raise ValueError(
                f"must be a DNS-1123 name (lowercase letters, digits and '-', starting and ending "
                f"with a letter or digit, at most {self.max_len} characters), got {shown(value)}"
            )


@dataclass(frozen=True)
class Shaped(Rule):
    """A string that must match `pattern`: `must be an EC2 instance type (…), got 'x'`; None passes."""

    pattern: re.Pattern[str]
    what: str
    verb: str = "be"

    def check(self, value: Any) -> None:
        if value is not None and not self.pattern.match(value):
            raise ValueError(f"must {self.verb} {self.what}, got {shown(value)}")


@dataclass(frozen=True)
class Blank(Rule):
    """An empty value (`RAYDLC_GPU_AZ=`, `bf16: ""`) means not set: None, decided later."""

    def before(self, value: Any) -> Any:
        return None if value in ("", None) else value


_FOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class FolderName(Rule):
    """One folder name, no path: it is joined under a storage root (and Ray Train names its run by it),
    so short and of characters every file system and URI takes."""

    max_len: int = 100

    def check(self, value: Any) -> None:
        if value is None:
            return
        if value in (".", "..") or "/" in value or "\\" in value:
            raise ValueError(f"must be one folder name (no '/'), got {shown(value)}")
        if len(value) > self.max_len:
            raise ValueError(f"must be at most {self.max_len} characters, got {len(value):,}: {shown(value)}")
        if not _FOLDER.match(value):
            raise ValueError(f"must be letters, digits, '.', '_' and '-', starting with a letter or digit, got {shown(value)}")


SHOWN_MAX = 60


def shown(value: Any) -> str:
    """A value as an error shows it: quoted, and cut when long (a 10 kB value is not echoed in full)."""
    text = repr(value)
    if len(text) <= SHOWN_MAX:
        return text
    return f"{text[:SHOWN_MAX]}… ({len(str(value)):,} characters)"


@dataclass(frozen=True)
class WholeOrAuto(Rule):
    """A whole number of `what` (at least 1), or the word `auto`; one message for anything else.

    Without it pydantic reports one error per member of `int | Literal["auto"]`.
    """

    what: str

    def before(self, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().lower()
            if value == "auto":
                return value
            if not value.lstrip("+-").isdigit():
                raise ValueError(f"must be a whole number of {self.what} or auto, got {value!r}")
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be a whole number of {self.what} or auto, got {value!r}")
        return value

    def check(self, value: Any) -> None:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be at least 1, or auto, got {value}")


def rules(metadata: list[Any]) -> list[Rule]:
    """The rules among a field's annotation metadata, in the order they were written."""
    return [m for m in metadata if isinstance(m, Rule)]
