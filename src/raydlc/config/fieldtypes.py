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
        if value is not None and not value > self.bound:
            raise ValueError(f"must be greater than {self.bound:g}, got {value}")


@dataclass(frozen=True)
class Below(Rule):
    """A number strictly less than a bound (a dropout probability): `must be less than 1 (why), got 1.0`."""

    bound: float
    why: str = ""

    def check(self, value: Any) -> None:
        if value is not None and not value < self.bound:
            raise ValueError(f"must be less than {self.bound:g}" + (f" ({self.why})" if self.why else "") + f", got {value}")


@dataclass(frozen=True)
class Between(Rule):
    """A number strictly inside two bounds (a share of the data)."""

    low: float
    high: float

    def check(self, value: Any) -> None:
        if not self.low < value < self.high:
            raise ValueError(f"must be between {self.low:g} and {self.high:g}, got {value}")


_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@?#]*@")


@dataclass(frozen=True)
class NoUserInfo(Rule):
    """A URI without `user[:password]@`: a credential in a config value would be rendered, logged and
    shown; it comes from the environment instead (`env`), and the value is never echoed."""

    env: str

    def check(self, value: Any) -> None:
        if value is not None and _USERINFO.match(value):
            raise ValueError(f"must not carry user:password (not shown); put the credential in {self.env} in the environment")


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
class Pattern(Rule):
    """A Python regular expression (`re`): one that does not compile is refused here, not in a worker."""

    def check(self, value: Any) -> None:
        if value is None:
            return
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"must be a Python regular expression ({e}), got {shown(value)}") from None


@dataclass(frozen=True)
class Blank(Rule):
    """An empty value (`RAYDLC_GPU_AZ=`, `bf16: ""`) means not set: None, decided later."""

    def before(self, value: Any) -> Any:
        return None if value in ("", None) else value


_AC_WORDS: dict[str, Any] = {"none": False, "full": True, "auto": None, "": None, "selective": "selective"}
_BOOL_WORDS = ("0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes")  # what pydantic reads as a bool


class CheckpointingMode(Blank):
    """ACTIVATION_CHECKPOINTING's words: none and full are false and true (what earlier configs wrote), auto is empty."""

    def before(self, value: Any) -> Any:
        if not isinstance(value, str):
            return super().before(value)
        word = value.strip().lower()
        if word in _AC_WORDS:
            return _AC_WORDS[word]
        if word in _BOOL_WORDS:
            return word
        raise ValueError(f"must be none, selective, full or auto (or true/false), got {shown(value)}")


_SQUASHED_URI = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):/(?!/)")


@dataclass(frozen=True)
class StorageLocation(Rule):
    """A local path or a URI (`s3://bucket/prefix`), kept as the text given: never parsed as a file system
    path, which would squash `s3://b/x` to the local `s3:/b/x`. A scheme followed by one slash is that
    squashed form (or a typo), refused rather than written to a local folder named `s3:`. A URI of a scheme
    raydlc does not store to, or an s3:// one without a valid bucket, is refused too (`also`: schemes let
    through for a later, more precise refusal, such as DATA's hf://)."""

    also: tuple[str, ...] = ()

    def check(self, value: Any) -> None:
        if value is None:
            return
        m = _SQUASHED_URI.match(value)
        if m and len(m.group(1)) > 1:  # `C:/data` on Windows is a drive, not a scheme
            raise ValueError(f"must be a local path or a URI such as {m.group(1)}://bucket/prefix (two slashes after "
                             f"'{m.group(1)}:'), got {shown(value)}")
        from raydlc.storage import SCHEMES, uri_problem

        if why := uri_problem(value, (*SCHEMES, *self.also)):
            raise ValueError(f"{why}, got {shown(value)}")


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


@dataclass(frozen=True)
class S3BucketName(Rule):
    """S3's rules for a general purpose bucket's name (raydlc.storage.bucket_problem). None passes (the default name)."""

    def check(self, value: Any) -> None:
        from raydlc.storage import bucket_problem

        if value is not None and (why := bucket_problem(value)):
            raise ValueError(f"must be an S3 bucket name: {why}, got {shown(value)}")


@dataclass(frozen=True)
class OffOrAtLeast(Rule):
    """0 switches it off; anything else has a floor below which it cannot mean what it says."""

    floor: float
    unit: str
    why: str

    def check(self, value: Any) -> None:
        if value is None or value == 0 or value >= self.floor:
            return
        raise ValueError(f"must be 0 (off) or at least {self.floor:g} {self.unit} ({self.why}), got {value:g}")
