"""What the log showed, frozen: one `Process` per NCCL process and one `NcclFacts` for the whole input.

The parser builds these and the verdict reads them; nothing between the two is shared or
mutable, so a verdict can be tested on facts written by hand, without a log line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_EMPTY: Mapping[str, object] = MappingProxyType({})


@dataclass(frozen=True)
class Evidence:
    """One log line that a conclusion rests on, with where it came from."""

    kind: str
    source: str
    line: int
    text: str


@dataclass(frozen=True)
class Process:
    """What one NCCL process showed: a `host:pid:[dev]` prefix, a Ray worker, a bare rank number, or a named machine.

    `choices` lists, in log order, the transports whose init listed devices ("probe": IB,
    Socket) and the OFI plugin coming up with a provider ("provider": Libfabric): the last
    one is where NCCL stopped looking. `addrs` holds the addresses by where NCCL printed
    them (bootstrap, socket, ib, ray, given: a caller's node name, if:<name>: one interface),
    one set per line. `joined` is commId -> (rank, bus id) and `local_ranks` commId ->
    localRanks: the communicators the process is in. `twins` are the other ranks of one
    communicator that the same prefix showed (other machines with the same hostname and pid).
    """

    key: str
    rank: int | None = None
    nranks: int = 0
    node: str | None = None
    ip: str | None = None
    pid: int | None = None
    device: int | None = None
    version: str | None = None
    plugin: str | None = None
    plugin_version: str | None = None
    provider: str | None = None
    fabric: str | None = None
    implied_provider: str | None = None
    selected: tuple[str, ...] = ()
    inits: tuple[str, ...] = ()
    choices: tuple[tuple[str, str], ...] = ()
    roce: bool = False
    ib_absent: bool = False
    boot_socket: bool = False
    transports: frozenset[str] = frozenset()
    nets: frozenset[str] = frozenset()
    gdr: bool = False
    nnodes: int | None = None
    errors: int = 0
    ofi_failed: bool = False
    addrs: Mapping[str, tuple[frozenset[str], ...]] = field(default_factory=lambda: _EMPTY)  # type: ignore[arg-type]
    joined: Mapping[str, tuple[int, str | None]] = field(default_factory=lambda: _EMPTY)  # type: ignore[arg-type]
    local_ranks: Mapping[str, int] = field(default_factory=lambda: _EMPTY)  # type: ignore[arg-type]
    twins: tuple[int, ...] = ()

    def all_addrs(self) -> set[str]:
        return {a for sets in self.addrs.values() for s in sets for a in s}


@dataclass(frozen=True)
class NcclFacts:
    """Everything the verdict may use: the processes, the lines no process can be named for, and what failed.

    `unattributed` collects what lines without a process prefix said (its key is "*").
    `ib_nodev` is the first line saying IB has no device (a failure only if IB was wanted:
    `ib_expected`); `provider_hint` the first line that proves the efa provider without naming it:
    libfabric's log of an opened efa endpoint (kind "provider"), an fi_addr_efa address
    ("efa-address") or an efa_<k> device name ("efa-device").
    """

    processes: tuple[Process, ...] = ()
    unattributed: Process = field(default_factory=lambda: Process(key="*"))
    env: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # type: ignore[arg-type]
    errors: tuple[Evidence, ...] = ()
    failures: tuple[Evidence, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    sources: tuple[str, ...] = ()
    lines: int = 0
    candidates: int = 0
    folded_repeats: int = 0
    ib_expected: bool = False
    ib_failed: bool = False
    ib_nodev: Evidence | None = None
    efa_failed: bool = False
    ofi_failed: bool = False
    plugin_failed: bool = False
    net_missing: str | None = None
    duplicate_gpu: bool = False
    provider_hint: Evidence | None = None

    @property
    def every(self) -> list[Process]:
        """The processes, then the unattributed lines' pseudo-process: what each per-process rule runs over."""
        return [*self.processes, self.unattributed]


def uniq(items: Iterable[str | None]) -> list[str]:
    """The distinct non-empty items, in first-seen order."""
    out: list[str] = []
    for i in items:
        if i and i not in out:
            out.append(i)
    return out
