"""Which transport really carried a job, read from NCCL's own debug output.

NCCL falls back silently: when the OFI plugin or the EFA device fails it picks InfiniBand,
then plain sockets, and the job still trains, at half speed. A grep for "Libfabric" cannot
tell the difference, because NCCL names the *selected* network long before any byte crosses
it, and the plugin names the network "Libfabric" whatever provider (efa, tcp, cxi) sits
below. So every verdict carries its level of proof:

- `carried`: channel lines (`... via NET/<name>/<dev>`), which NCCL prints only when it sets
  up a connection over that network, show the traffic;
- `selected`: NCCL (`Using network X`, `Assigned NET plugin X`, the IB/Socket transport's
  device list) or the OFI plugin (`Selected provider is efa`) reported choosing it, and no
  channel line is in the log;
- no proof (`unknown`) when neither is there.

Ranks that disagree make `mixed`, never a majority. Machines are told apart by hostname and
by the addresses NCCL prints (bootstrap, NET/Socket, NET/IB OOB, Ray's `ip=`), by one
process showing two ranks of one communicator, and by two ranks of one communicator on one
GPU bus id: containers that all call themselves `ubuntu` are still several nodes.

Every inference rests on wording NCCL or aws-ofi-nccl prints; `RULES` names each one and
where it appears (source file, releases). The wording covered spans NCCL 2.3 (`Ring 00 :
0[0] -> 1[1] via ...`, `Using internal Network IB`) to 2.29 (`Assigned NET plugin ... to
comm`, `nRanks ... nNodes`) and aws-ofi-nccl 1.x (`Using aws-ofi-nccl 1.3.0aws`,
`Initializing aws-ofi-nccl 1.17.2`, `Selected Provider is efa (found 4 nics)`, `Selected
provider is efa, fabric is efa-direct`).

Pure: lines or byte chunks in, an `NcclReport` out. Reading files is `collect.py`'s job;
`ChunkScanner(parser, source, node=...)` lets a caller that knows which machine a file came
from (per-node worker logs) say so, and `NcclReport.hosts` answers per machine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

VERDICTS: tuple[str, ...] = ("efa", "socket", "ib", "libfabric-other", "single-node", "mixed", "unknown")
EXPECTABLE: tuple[str, ...] = ("efa", "socket", "ib", "single-node")
PROOFS: tuple[str, ...] = ("carried", "selected")

# Relative speed of what carried inter-node traffic; a fallback lands on a lower rank.
_SPEED = {"efa": 3, "ib": 3, "net plugin": 3, "libfabric-other": 2, "socket": 1}

MAX_EVIDENCE_PER_KIND = 4
# PyTorch prints the NCCL result code, "Last error:" and the cause on the lines after "NCCL error".
ERROR_CONTEXT_LINES = 3
MAX_ERRORS = 200


class Rule(NamedTuple):
    """A line NCCL or the plugin prints, what it tells, and where that wording comes from."""

    wording: str
    tells: str
    source: str


# Evidence kinds are keys of this table: each conclusion names the rule it rests on.
RULES: dict[str, Rule] = {
    "net-channel": Rule(
        "Channel 00/0 : 0[..] -> 8[..] [send|receive] via NET/<net>/<dev>[(proxy)][/GDRDMA][/Shared]; NCCL 2.3-2.4: Ring 00 : 0 -> 8 via NET/<net>/<dev>",
        "a connection was set up over that network: the only proof of traffic (`carried`)",
        "NCCL src/transport/net.cc (net.cu in 2.3): printed in the NET transport's send/recv setup, 2.3-2.29"),
    "channel": Rule(
        "Channel ... via P2P/IPC | P2P/CUMEM | P2P/direct pointer | SHM/direct/direct | direct shared memory; Connected NVLS",
        "a peer reached without any network (same host)",
        "NCCL src/transport/p2p.cc, shm.cc ('direct shared memory' 2.3-2.12, 'SHM/%s/%s' since 2.13), nvls.cc"),
    "network": Rule(
        "Using network <X>; Assigned NET plugin <X> to comm; Using internal Network <X>",
        "NCCL chose network X for this communicator (`selected`)",
        "NCCL src/init.cc 'Using network %s' since 2.6; src/plugin/net.cc 'Assigned NET plugin %s to comm' since 2.27; "
        "src/init.cu 'Using internal Network %s' in 2.3"),
    "net-init": Rule(
        "Initialized NET plugin <X> / Failed to initialize NET plugin <X>",
        "plugins are tried in order (external, IB, Socket) and the first that initialises is assigned to the comm: "
        "'Initialized' is a selection, 'Failed' a plugin that was skipped",
        "NCCL src/plugin/net.cc ncclNetPluginInit + ncclNetInit loop, 'Initialized' since 2.27, 'Failed to initialize' since 2.28"),
    "ib-init": Rule(
        "NET/IB : Using [0]mlx5_0:1/IB|RoCE ... ; OOB <if>:<addr><port>",
        "the IB transport found devices (link layer IB or RoCE) and, unless NCCL_NET names another network, is the one "
        "NCCL takes when no external plugin initialised; the OOB address identifies the machine",
        "NCCL src/transport/net_ib.cc (net_ib/init.cc in 2.29) since 2.4; the line is printed even with no device "
        "(then after 'NET/IB : No device found.'), so only a listed device counts"),
    "socket-init": Rule(
        "NET/Socket : Using [0]<if>:<addr><port> ...; NET/Socket: Using N threads and M sockets per thread",
        "the Socket transport initialised: reached only when neither a plugin nor IB did (or NCCL_NET=Socket), except "
        "in NCCL 2.4.0-2.4.7, which initialised Socket first for its bootstrap (then it comes before 'NET/Plugin'); "
        "the addresses identify the machine",
        "NCCL src/transport/net_socket.cc since 2.4 (ncclNetSocketInit; threads line on connection setup); "
        "src/init.cu initNet in 2.4.0-2.4.7, src/bootstrap.cc 'Bootstrap : Using' from 2.4.8"),
    "bootstrap": Rule(
        "Bootstrap : Using <if>:<addr><port> (Bootstrap: Using since 2.24)",
        "the out-of-band address of the process, printed once per process: tells machines that share a hostname apart",
        "NCCL src/bootstrap.cc bootstrapNetInit, 2.4-2.29"),
    "provider": Rule(
        "NET/OFI Selected Provider is <p> (found N nics); NET/OFI Selected provider is <p>, fabric is <f> (found N nics)",
        "the OFI plugin's provider: efa/efa-direct is EFA, anything else (tcp, sockets, cxi, verbs) is not",
        "aws-ofi-nccl src/nccl_ofi_net.c 'Selected Provider is %s' v0.9-v1.13.2; 'Selected provider is %s, fabric is %s' "
        "src/nccl_ofi_net.cpp v1.14.0-v1.21.1"),
    "efa-wording": Rule(
        "NET/OFI Setting provider_filter to efa; NET/OFI Forcing AWS OFI ndev N",
        "the plugin restricted itself to the efa provider (so if its network is then used, it is EFA), or took the "
        "EFA-only device path",
        "aws-ofi-nccl src/platform-aws.c(pp) platform_init, printed when FI_PROVIDER is unset, v1.6.0-v1.21.1; "
        "'Forcing AWS OFI ndev' in src/nccl_ofi_net.c only for the EFA provider, v1.0.1-aws-v1.5.0-aws"),
    "libfabric": Rule(
        "libfabric:<pid>:<ts>:<prov>:<subsys>:...<warn> ...",
        "libfabric's own warnings: an efa endpoint/domain/cq/av/mr subsystem line means an efa endpoint was opened; "
        "'provider efa ... empty' or efa 'failed to open' is an EFA failure",
        "libfabric prov/efa logging (FI_LOG_LEVEL=warn, the default)"),
    "plugin": Rule(
        "NET/Plugin: Loaded net plugin <X> (vN); NET/OFI Using|Initializing aws-ofi-nccl <V>; NET/Plugin : No plugin found / "
        "Could not find: libnccl-net.so; P2P plugin IBext; Plugin Path : ...",
        "which net plugin is present (not that it was chosen); a missing libnccl-net.so means NCCL's internal IB/Socket by design",
        "NCCL src/net.cc (2.4-2.18) and src/plugin/net/net_vN.cc, plugin_open.cc (2.19-2.29); aws-ofi-nccl "
        "'Using ' PACKAGE_STRING v1.1.4-v1.7.0, 'Initializing ' PACKAGE_STRING v1.7.1-v1.21.1; HPC-X nccl-rdma-sharp-plugins"),
    "plugin-failure": Rule(
        "NET/Plugin: Failed to find ncclNetPlugin symbol; Could not find: <name> libnccl-net-<name>.so; <lib>.so: version `X' not found",
        "a requested or present net plugin could not be used: NCCL goes on with IB or Socket",
        "NCCL src/net.cc and src/plugin/plugin_open.cc ('Could not find:' since 2.22)"),
    "ofi-failure": Rule(
        "NCCL WARN NET/OFI ...: aws-ofi-nccl initialization failed; Couldn't find any optimal provider; No eligible providers "
        "were found; Unable to find a protocol that worked; Initializing plugin failed; Only EFA provider is supported",
        "the OFI plugin did not start: anything that crosses a network afterwards is a fallback",
        "aws-ofi-nccl: 'initialization failed' v1.1.4-v1.21.1, 'Couldn't find any optimal provider' v1.1.0-v1.8.1, 'No eligible "
        "providers' v1.14.1-v1.21.1, 'Unable to find a protocol that worked' v1.13.0-v1.21.1, 'Only EFA provider is supported' "
        "v1.0.1-aws-v1.5.0-aws"),
    "ib": Rule(
        "NET/IB : No device found.; NCCL WARN NET/IB : ...",
        "IB probed and absent: a failure only when IB was wanted (NCCL_IB_HCA, NCCL_IB_DISABLE=0, an IB plugin)",
        "NCCL src/transport/net_ib.cc since 2.4"),
    "network-missing": Rule(
        "NCCL WARN Error: network <X> not found.",
        "NCCL_NET named a network that did not initialise: NCCL stops instead of falling back",
        "NCCL src/net.cc ncclNetInit 2.10-2.26"),
    "comm": Rule(
        "comm 0x.. rank R nRanks N nNodes K localRanks L localRank l; ncclCommInitRank comm 0x.. rank R nranks N cudaDev D "
        "busId B commId 0x.. - Init START; comm 0x.. rank R nranks N ... - Init COMPLETE",
        "a communicator's size and node count (nNodes > 1 is never single-node), the rank a process holds in it, its GPU",
        "NCCL src/init.cc: 'Init COMPLETE' since 2.4, 'commId ... Init START' since 2.18, 'nNodes/localRanks' since 2.20"),
    "duplicate-gpu": Rule(
        "two ranks of one communicator (same commId) with the same busId under one hostname",
        "two machines: NCCL refuses two ranks on one GPU of one host ('Duplicate GPU detected')",
        "NCCL src/init.cc, WARN 'Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx', 2.5-2.29"),
    "pid-collision": Rule(
        "one host:pid:[dev] prefix showing two ranks of one communicator, or two different bootstrap/OOB addresses",
        "two machines that share a hostname and a pid (containers): a process holds one rank per communicator per GPU and "
        "prints its bootstrap and transport addresses once",
        "NCCL src/init.cc (one rank per comm per device), src/bootstrap.cc and net_ib/net_socket init (printed once per process)"),
    "version": Rule("NCCL version X.Y.Z+cudaV", "the NCCL build", "NCCL src/init.cc"),
    "warn": Rule("NCCL WARN ...", "an error NCCL reported", "NCCL src/debug.cc (WARN level)"),
    "error": Rule(
        "ncclSystemError / ncclInternalError / NCCL error / DistBackendError / Watchdog caught collective operation timeout",
        "the application saw an NCCL failure", "PyTorch ProcessGroupNCCL exceptions"),
    "ofi": Rule("NET/OFI ...", "other OFI plugin lines kept as context", "aws-ofi-nccl"),
    "socket": Rule("NET/Socket ...", "other Socket transport lines kept as context", "NCCL src/transport/net_socket.cc"),
}

# ---------------------------------------------------------------------------------------
# Candidate search over raw bytes: one literal-prefixed pattern per pass, so the regex
# engine skips to each "NCCL" in C and Python only sees the lines worth parsing.
_CAND_NCCL = re.compile(
    rb"NCCL (?:WARN|ABORT|version|error|communicator|INFO (?:\[Rank \d+\] )?(?:Channel|Ring|Bootstrap|Failed to initialize NET"
    rb"|Using (?:network|internal Net)|Initialized NET|Assigned NET|NET/(?:Plugin|IB|Socket"
    rb"|OFI (?:Selected|Using aws|Initializing aws|Setting provider_filter|Forcing AWS))"
    rb"|P2P plugin|Plugin Path|comm 0x|ncclComm|rank \d+ nranks|Init timings|NCCL version|NCCL_[A-Z0-9_]+ set |NVLS comm|Connected (?:NVLS|all)))"
    rb"|NCCL\.cpp:\d+\][^\n]*?(?:[Tt]imeout|[Ee]rror|[Ff]ail)"
)
# Rarer anchors, located with bytes.find (faster than the regex engine's prefix scan for
# a literal that seldom occurs) and confirmed with a match at that spot.
# (A lower-case "nccl" pass for bare `ncclSystemError:` lines cost as much as the main scan;
# PyTorch prints those under an "NCCL error" line, which the main pass already catches.)
_CAND_OTHER = ((b"libfabric:", re.compile(rb"libfabric:[^\n]*?<warn>")),)
# (Ray's "[repeated Nx across cluster]" folds are counted on the lines read as evidence: a
# separate pass for the marker costs a quarter of the whole scan.)

# ---------------------------------------------------------------------------------------
# Line-level patterns (str), applied only to candidate lines.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY = re.compile(r"\((\w+) pid=(\d+)(?:, ip=([0-9A-Fa-f.:]+))?\)")
_REPEATED = re.compile(r"\s*\[repeated (\d+)x across cluster\]")
_PREFIX_HEAD = re.compile(r"[^\s:|\[\]()]+:\d+:\d+ \[\d+\] ")
# WARN lines put the source location between the prefix and "NCCL": `proxy.cc:1485`,
# `nccl_net_ofi_init:155`, or a whole C++ signature in aws-ofi-nccl >= 1.14.
_PREFIX = re.compile(r"([^\s:|\[\]()]+):(\d+):(\d+) \[(\d+)\] (?:.*? )?NCCL (INFO|WARN|TRACE|ABORT) ?(.*)")
_BARE = re.compile(r"NCCL (INFO|WARN|TRACE|ABORT) ?(.*)")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(\S*)")
_OFI_VERSION = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl (\S+)")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^\s,(]+)(?:, fabric is ([^\s,(]+))?")
_LOADED_PLUGIN = re.compile(r"NET/Plugin ?: Loaded net plugin (.+?)\s*\((v\d+)\)")
_P2P_PLUGIN = re.compile(r"^P2P plugin (?:v\d+ )?(\S+)")
_SO_PROBLEM = re.compile(r"([\w.+\-/]+\.so[\w.]*): (cannot open shared object file|version `[^']*' not found|undefined symbol)")
_REQUESTED_PLUGIN_MISSING = re.compile(r"Could not find: (\S+) (libnccl-net-\S+\.so)|Plugin load \((libnccl-net-\S+\.so)\) returned")
_COMM = re.compile(r"\brank (\d+) n[Rr]anks (\d+)(?: nNodes (\d+))?")
_COMM_PTR = re.compile(r"\bcomm (0x[0-9a-fA-F]+)")
_COMM_ID = re.compile(r"\bcommId (0x[0-9a-fA-F]+)")
_BUS_ID = re.compile(r"\bbusId ([0-9a-fA-Fx]+)")
_LOCAL_RANKS = re.compile(r"\blocalRanks (\d+)")
_CHANNEL = re.compile(
    r"(?:Channel|Ring) \d+(?:/\d+)? : (\d+)(?:\[[0-9a-fA-Fx]+\])? -> (\d+)(?:\[[0-9a-fA-Fx]+\])?"
    r"(?: \[(send|receive)\])? via (.+)"
)
# NET/<name>/<dev>[(proxy rank)][/GDRDMA][/Shared][/flush=…]
_NET_TRANSPORT = re.compile(r"^NET/(.+?)/(\d+)(?:\(\d+\))?((?:/[^/\s]+)*)\s*$")
_ENV = re.compile(r"^(NCCL_[A-Z0-9_]+) set (?:by environment )?to (.*?)\.?\s*$")
_LIBFABRIC = re.compile(r"libfabric:\d+(?::\d+)?:+([\w-]*):(\w*):([^:]*):[^<]*<warn>\s*(.*)")
# Subsystems where only an opened endpoint/domain of that provider logs.
_LIBFABRIC_EP_SUBSYS = ("ep_ctrl", "ep_data", "cq", "av", "domain", "mr")
_APP_ERROR = re.compile(
    r"(nccl(?:(?:System|Internal|Remote|UnhandledCuda)Error|Invalid(?:Usage|Argument))|NCCL error|"
    r"NCCL communicator|Watchdog caught collective operation timeout|DistBackendError)"
)
# `<ifname>:<address><port>` as NCCL's socketToString prints it (IPv4, or IPv6 with %scope).
_ADDR = re.compile(r"([\w.\-]+):(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F]*:[0-9a-fA-F:.]*(?:%[\w.\-]+)?)<\d+>")
# A device in the IB transport's list: ` [0]mlx5_0:1/IB`, ` [3]mlx5_3:1/RoCE`, `/IB/SHARP`.
_IB_DEV = re.compile(r"\[\d+\][\w.\-]+:\d+/(\w+)")


_MISS = object()


@dataclass
class Evidence:
    """One log line that a conclusion rests on, with where it came from."""

    kind: str
    source: str
    line: int
    text: str


@dataclass
class RankInfo:
    """What one NCCL process (or, without prefixes, one rank number) showed."""

    key: str
    rank: int | None = None
    nranks: int | None = None
    node: str | None = None
    ip: str | None = None
    pid: int | None = None
    device: int | None = None
    nccl_version: str | None = None
    plugin: str | None = None
    provider: str | None = None
    fabric: str | None = None
    network: str | None = None
    transports: list[str] = field(default_factory=list)
    inter_node: str | None = None
    gdr: bool | None = None
    errors: int = 0
    proof: str | None = None
    host: str | None = None


@dataclass
class HostInfo:
    """One machine (or, where NCCL shows more than the log can separate, several with one name)."""

    host: str
    name: str
    addresses: list[str]
    machines: int
    processes: list[str]
    ranks: list[int]
    inter_node: str | None
    proof: str | None
    why: list[str] = field(default_factory=list)
    told_by: str = "hostname"  # what sets it apart: hostname, addresses (a shared hostname), or caller (a node name given)


@dataclass
class NcclReport:
    """The answer for a whole log: verdict, how it is known, fallback, and the lines it rests on."""

    verdict: str
    proof: str | None
    fallback: bool
    fallback_from: str | None
    gdr: bool | None
    nccl_version: str | None
    plugin: str | None
    plugin_version: str | None
    provider: str | None
    fabric: str | None
    network: str | None
    nodes: int | None
    ranks: list[RankInfo]
    errors: list[Evidence]
    evidence: list[Evidence]
    failures: list[Evidence]
    reasons: list[str]
    causes: list[str]
    env: dict[str, str]
    sources: list[str]
    lines: int
    candidates: int
    folded_repeats: int = 0
    hosts: list[HostInfo] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        from dataclasses import asdict

        return asdict(self)


@dataclass
class _Proc:
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
    selected: list[str] = field(default_factory=list)
    inits: list[str] = field(default_factory=list)  # "Initialized NET plugin X"
    # In order: transports whose init listed devices ("probe": IB, Socket) and the OFI plugin
    # coming up with a provider ("provider": Libfabric). The last one is where NCCL stopped.
    choices: list[tuple[str, str]] = field(default_factory=list)
    roce: bool = False
    ib_absent: bool = False  # "NET/IB : No device found." from this process
    boot_socket: bool = False  # a Socket init that was NCCL 2.4.0-2.4.7's bootstrap
    transports: set[str] = field(default_factory=set)
    nets: set[str] = field(default_factory=set)
    gdr: bool = False
    nnodes: int | None = None
    errors: int = 0
    ofi_failed: bool = False
    # Addresses by where NCCL printed them: bootstrap, socket, ib, ray, given (a caller's node name).
    addrs: dict[str, list[frozenset[str]]] = field(default_factory=dict)
    comm_rank: dict[str, int] = field(default_factory=dict)  # comm pointer or commId -> rank
    comm_ids: dict[str, str] = field(default_factory=dict)  # comm pointer -> commId
    joined: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # commId -> (rank, busId)
    local_ranks: dict[str, int] = field(default_factory=dict)  # commId -> localRanks
    twins: dict[int, _Proc] = field(default_factory=dict)  # rank -> same prefix, another machine
    twin_of: str | None = None

    def add_addrs(self, kind: str, addrs: Iterable[str]) -> None:
        s = frozenset(addrs)
        if s:
            seen = self.addrs.setdefault(kind, [])
            if s not in seen:
                seen.append(s)

    def add_interfaces(self, kind: str, found: list[tuple[str, str]]) -> None:
        """`(ifname, address)` pairs of one line; NCCL picks interfaces the same way for its
        bootstrap, Socket and IB OOB (ncclFindInterfaces), so one interface name with two
        addresses is two machines whatever line printed them."""
        self.add_addrs(kind, (a for _, a in found))
        for ifname, a in found:
            self.add_addrs("if:" + ifname, [a])

    def all_addrs(self) -> set[str]:
        return {a for sets in self.addrs.values() for s in sets for a in s}


def net_class(name: str, provider: str | None) -> str:
    """Map NCCL's network name (and the OFI provider below it) to a verdict word.

    "Libfabric"/"AWS Libfabric" is aws-ofi-nccl's network name whatever the provider, so
    without a provider it stays `libfabric?`: never EFA from the name alone.
    """
    low = name.strip().lower()
    if low.startswith("socket") or low.startswith("fastsocket"):
        return "socket"
    if low.startswith("ib") or low.startswith("gib") or low.startswith("rdma") or low == "nccl rdma plugin":
        return "ib"
    if "libfabric" in low or low.startswith("ofi") or low == "aws ofi":
        if provider is None:
            return "libfabric?"
        return "efa" if provider.split(";")[0] in ("efa", "efa-direct") else "libfabric-other"
    return "unknown"


class NcclParser:
    """Feed candidate lines in order (with their line numbers); `report()` concludes."""

    def __init__(self) -> None:
        self.procs: dict[str, _Proc] = {}
        self.glob = _Proc(key="*")
        self.errors: list[Evidence] = []
        self.failures: list[Evidence] = []
        self.evidence: list[Evidence] = []
        self._kind_count: dict[str, int] = {}
        self.env: dict[str, str] = {}
        self.sources: list[str] = []
        self.lines = 0
        self.candidates = 0
        self.repeated = 0
        self.ib_expected = False
        self.ib_nodev: Evidence | None = None
        self.provider_hint: Evidence | None = None
        self.efa_failed = False
        self.ofi_failed = False
        self.plugin_failed = False
        self.ib_failed = False
        self.net_missing: str | None = None
        self.duplicate_gpu = False  # NCCL said two ranks share a GPU of one host
        self._last_text = ""
        self._heads: dict[str, object] = {}
        self._chan_seen: set[tuple[str, str]] = set()
        self._chan_bytes_seen: set[bytes] = set()
        self._info_seen: set[str] = set()
        self.context_wanted = 0
        self.provider_sources: set[str] = set()
        self._line_of: Callable[[], int] | None = None
        self.node_hint: str | None = None  # the machine the current source came from, if the caller knows

    # -- intake -----------------------------------------------------------------------
    def feed_line(self, text: str, line: int = 0, source: str = "-") -> None:
        """Parse one line of any supported format; lines without evidence are ignored."""
        self.candidates += 1
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        if " | " in text:
            text = _last_segment(text)
        text = text.rstrip("\r\n")
        if text == self._last_text:  # doubled exports: same line twice in a row
            return
        self._last_text = text
        rep = _REPEATED.search(text) if "repeated" in text else None
        if rep:
            self.repeated += int(rep.group(1))
            text = text[: rep.start()] + text[rep.end():]
        if text.count(" NCCL ") > 1:
            heads = [m.start() for m in _PREFIX_HEAD.finditer(text)]
            if len(heads) > 1:
                bounds = [0, *heads[1:], len(text)]
                for a, b in zip(bounds, bounds[1:]):
                    self._one(text[a:b].strip(), line, source)
                return
        self._one(text, line, source)

    def _one(self, text: str, line: int, source: str) -> None:
        proc, level, msg = self._identify(text)
        if level == "INFO":
            # An INFO line seen before (a restarted worker group, a re-created communicator)
            # changes nothing: every INFO rule is idempotent. WARN lines are all counted.
            key = text if self.node_hint is None else self.node_hint + "\x00" + text
            if key in self._info_seen:
                return
            if len(self._info_seen) > 1_000_000:
                self._info_seen.clear()
            self._info_seen.add(key)
        self._dispatch(proc, level, msg, text, line, source)

    def _identify(self, text: str) -> tuple[_Proc | None, str | None, str]:
        """Who printed the line (a process), its level and message.

        The text before " NCCL INFO"/" NCCL WARN" repeats on every line of a thread, so
        its parse is cached: most lines cost one find and one dict lookup.
        """
        i = text.find(" NCCL ")
        if i > 0:
            level = text[i + 6 : i + 10]
            if level == "INFO" or level == "WARN":
                head = text[:i] if self.node_hint is None else self.node_hint + "\x00" + text[:i]
                proc = self._heads.get(head, _MISS)
                if proc is _MISS:
                    if len(self._heads) > 50_000:
                        self._heads.clear()
                    proc = self._heads[head] = self._identify_slow(text[:i] + " NCCL INFO ")[0]
                return proc, level, text[i + 11 :]
        return self._identify_slow(text)

    def _identify_slow(self, text: str) -> tuple[_Proc | None, str | None, str]:
        m = _PREFIX.search(text)
        ray = _RAY.search(text) if "pid=" in text else None
        hint = self.node_hint
        if m:
            host, pid, dev = m.group(1), int(m.group(2)), int(m.group(4))
            key = f"{host}:{pid}:{dev}" + (f"@{hint}" if hint else "")
            proc = self.procs.get(key)
            if proc is None:
                proc = self.procs[key] = _Proc(key=key, node=host, pid=pid, device=dev)
                if hint:
                    proc.add_addrs("given", [hint])
            if ray and ray.group(3):
                proc.ip = ray.group(3)
                proc.add_addrs("ray", [ray.group(3)])
            return proc, m.group(5), m.group(6)
        b = _BARE.search(text)
        if ray:
            node = ray.group(3) or "ray-driver-node"
            key = f"{node}:{ray.group(2)}" + (f"@{hint}" if hint else "")
            proc = self.procs.get(key)
            if proc is None:
                proc = self.procs[key] = _Proc(key=key, node=node, ip=ray.group(3), pid=int(ray.group(2)))
                if ray.group(3):
                    proc.add_addrs("ray", [ray.group(3)])
                if hint:
                    proc.add_addrs("given", [hint])
            return proc, (b.group(1) if b else None), (b.group(2) if b else text)
        if hint:  # no prefix, but the caller said which machine this file is from
            proc = self.procs.get(hint)
            if proc is None:
                proc = self.procs[hint] = _Proc(key=hint, node=hint)
                proc.add_addrs("given", [hint])
            return proc, (b.group(1) if b else None), (b.group(2) if b else text)
        if b:
            return None, b.group(1), b.group(2)
        return None, None, text

    def _rank_proc(self, rank: int) -> _Proc:
        key = f"rank {rank}"
        proc = self.procs.get(key)
        if proc is None:
            proc = self.procs[key] = _Proc(key=key, rank=rank)
        return proc

    def _ln(self, line: int) -> int:
        """Line numbers from a chunk scanner are counted only for lines that are kept."""
        return line if line >= 0 or self._line_of is None else self._line_of()

    def _note(self, kind: str, text: str, line: int, source: str) -> None:
        n = self._kind_count.get(kind, 0)
        self._kind_count[kind] = n + 1
        if n < MAX_EVIDENCE_PER_KIND:
            self.evidence.append(Evidence(kind, source, self._ln(line), text.strip()))

    def _fail(self, what: str, text: str, line: int, source: str) -> None:
        if len(self.failures) < MAX_ERRORS:
            self.failures.append(Evidence(what, source, self._ln(line), text.strip()))

    def _error(self, proc: _Proc | None, text: str, line: int, source: str) -> None:
        if proc is not None:
            proc.errors += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(Evidence("error", source, self._ln(line), text.strip()))

    def _dispatch(self, proc: _Proc | None, level: str | None, msg: str, text: str, line: int, source: str) -> None:
        tgt = proc or self.glob
        if level is None:
            v = _VERSION.search(text) if "NCCL version" in text else None
            if v:
                tgt.version = v.group(1) + v.group(2)
                self._note("version", text, line, source)
            self._other(proc, msg, text, line, source)  # PyTorch's "NCCL error …, NCCL version x" is both
            return
        if level == "WARN" or level == "ABORT":
            self._warn(proc, msg, text, line, source)
            return
        c = msg[:1]
        if c == "[" and msg.startswith("[Rank "):
            msg = msg[msg.find("] ") + 2 :]
            c = msg[:1]
        if c == "C":
            if msg.startswith("Channel"):
                k = msg.find(" via ")
                if k < 0:
                    return  # a ring listing ("Channel 00/02 : 0 1 2 3"), not a connection
                if proc is not None and not proc.twins:
                    # Same process, same transport: nothing new but a count.
                    seen = (proc.key, msg[k:])
                    if seen in self._chan_seen:
                        self._kind_count["channel"] = self._kind_count.get("channel", 0) + 1
                        return
                    self._chan_seen.add(seen)
                ch = _CHANNEL.match(msg)
                if ch:
                    self._channel(proc, ch, text, line, source)
            elif msg.startswith("Connected NVLS"):
                tgt.transports.add("NVLS")
                self._note("channel", text, line, source)
            return
        if c == "R":
            if msg.startswith("Ring"):
                ch = _CHANNEL.match(msg)
                if ch:
                    self._channel(proc, ch, text, line, source)
            return
        if c == "U":
            for prefix in ("Using network ", "Using internal Network "):
                if msg.startswith(prefix):
                    self._select(tgt, msg[len(prefix):].strip(), text, line, source)
            return
        if c == "A":
            if msg.startswith("Assigned NET plugin "):
                self._select(tgt, msg[20:].split(" to comm", 1)[0].strip(), text, line, source)
            return
        if c == "I":
            # NCCL >= 2.27 (src/plugin/net.cc): the plugin that initialises first is assigned to the comm.
            if msg.startswith("Initialized NET plugin"):
                name = msg[22:].strip()
                if name and name not in tgt.inits:
                    tgt.inits.append(name)
                self._note("net-init", text, line, source)
            elif msg.startswith("Init timings"):  # "Init timings - ncclCommInitRank: rank 0 nranks 16 …" (2.23+)
                m = _COMM.search(msg)
                if m:
                    self._comm(proc, m, msg, text, line, source)
            return
        if c == "F":
            if msg.startswith("Failed to initialize NET plugin"):
                self._plugin_init_failed(tgt, msg[31:].strip(), text, line, source)
            return
        if c == "B":
            if msg.startswith("Bootstrap"):  # "Bootstrap : Using eth0:10.0.0.1<0>" (src/bootstrap.cc)
                tgt.add_interfaces("bootstrap", _ADDR.findall(msg))
                self._note("bootstrap", text, line, source)
            return
        if c == "N":
            if msg.startswith("NET/OFI"):
                self._ofi(tgt, msg, text, line, source)
            elif msg.startswith("NET/Plugin"):
                self._plugin(tgt, msg, text, line, source)
            elif msg.startswith("NET/IB"):
                self._net_ib(tgt, msg, text, line, source)
            elif msg.startswith("NET/Socket"):
                self._net_socket(tgt, msg, text, line, source)
            elif msg.startswith("NCCL version"):
                v = _VERSION.match(msg)
                if v:
                    tgt.version = v.group(1) + v.group(2)
                    self._note("version", text, line, source)
            elif msg.startswith("NCCL_"):
                self._env(msg)
            elif msg.startswith("NVLS comm "):  # NVLS set up (transport/nvls.cc); "NVLS multicast support is …" is not
                tgt.transports.add("NVLS")
                self._note("channel", text, line, source)
            return
        if c == "P":
            if msg.startswith("P2P plugin") or msg.startswith("Plugin Path"):
                self._plugin(tgt, msg, text, line, source)
            return
        if c == "c" or c == "n" or c == "r":
            m = _COMM.search(msg)
            if m:
                self._comm(proc, m, msg, text, line, source)

    def _net_ib(self, tgt: _Proc, msg: str, text: str, line: int, source: str) -> None:
        """NCCL's IB transport init: `NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.1.2.3<0>` (rule ib-init)."""
        if "No device found" in msg:
            self._note("ib", text, line, source)
            tgt.ib_absent = True
            if self.ib_nodev is None:
                self.ib_nodev = Evidence("ib", source, self._ln(line), text.strip())
            return
        links = _IB_DEV.findall(msg) if "Using" in msg else []
        if not links:  # "Using [RO]; OOB …" with no device follows "No device found"
            self._note("ib", text, line, source)
            return
        if ("probe", "IB") not in tgt.choices:
            tgt.choices.append(("probe", "IB"))
        if any(x == "RoCE" for x in links):
            tgt.roce = True
        k = msg.find("OOB ")
        if k >= 0:
            tgt.add_interfaces("ib", _ADDR.findall(msg, k))
        self._note("ib-init", text, line, source)

    def _net_socket(self, tgt: _Proc, msg: str, text: str, line: int, source: str) -> None:
        """NCCL's Socket transport: `NET/Socket : Using [0]eth0:10.0.0.1<0>` at init (rule socket-init)."""
        addrs = _ADDR.findall(msg)
        if addrs or "sockets per thread" in msg:
            if ("probe", "Socket") not in tgt.choices:
                tgt.choices.append(("probe", "Socket"))
            tgt.add_interfaces("socket", addrs)
            self._note("socket-init", text, line, source)
        else:
            self._note("socket", text, line, source)

    def _plugin_init_failed(self, tgt: _Proc, name: str, text: str, line: int, source: str) -> None:
        """NCCL >= 2.28 tries its network plugins in turn and says which could not start (rule net-init)."""
        self._note("net-init", text, line, source)
        low = name.lower()
        if low.startswith("ib"):
            # Probing IB on an Ethernet host is normal; it is a failure only if IB was wanted.
            if self.ib_nodev is None:
                self.ib_nodev = Evidence("ib", source, self._ln(line), text.strip())
        elif "libfabric" in low or low.startswith("ofi"):
            self.ofi_failed = tgt.ofi_failed = True
            self._fail("ofi", text, line, source)
        elif low and not low.startswith("socket"):
            self.plugin_failed = True
            self._fail("plugin", text, line, source)

    def _select(self, tgt: _Proc, name: str, text: str, line: int, source: str) -> None:
        if name and name not in tgt.selected:
            tgt.selected.append(name)
        self._note("network", text, line, source)

    def _comm(self, proc: _Proc | None, m: re.Match[str], msg: str, text: str, line: int, source: str) -> None:
        """A communicator line (rule comm); a rank clash under one prefix is another machine (rule pid-collision)."""
        rank, nranks = int(m.group(1)), int(m.group(2))
        p = proc or self._rank_proc(rank)
        ptr = _COMM_PTR.search(msg) if proc is not None else None
        if ptr and (msg.endswith("Destroy COMPLETE") or msg.endswith("Abort COMPLETE")):
            p.comm_rank.pop(f"{ptr.group(1)}/{nranks}", None)  # the address may come back for another comm
            ptr = None
        if ptr:
            cid_m = _COMM_ID.search(msg)
            if cid_m:
                p.comm_ids[ptr.group(1)] = cid_m.group(1)
            cid = p.comm_ids.get(ptr.group(1))
            ckey = cid or f"{ptr.group(1)}/{nranks}"
            known = p.comm_rank.get(ckey)
            if known is None:
                p.comm_rank[ckey] = rank
            elif known != rank:
                # One process holds one rank of a communicator per GPU: this is another machine
                # whose hostname, pid and device index are the same (containers).
                twin = p.twins.get(rank)
                if twin is None:
                    twin = p.twins[rank] = self.procs[f"{p.key}#{rank}"] = _Proc(
                        key=f"{p.key}#{rank}", node=p.node, ip=p.ip, pid=p.pid, device=p.device, version=p.version,
                        twin_of=p.key)
                    twin.addrs = {k: list(v) for k, v in p.addrs.items()}
                    self._note("pid-collision", text, line, source)
                p = twin
                p.comm_rank[ckey] = rank
            if cid:
                bus = _BUS_ID.search(msg)
                if cid not in p.joined or bus:
                    p.joined[cid] = (rank, bus.group(1).lower().removeprefix("0x").lstrip("0") if bus else None)
                lr = _LOCAL_RANKS.search(msg)
                if lr:
                    p.local_ranks[cid] = int(lr.group(1))
        if nranks >= p.nranks:
            p.rank, p.nranks = rank, nranks
        if m.group(3):
            nn = int(m.group(3))
            if p.nnodes is None or nn > p.nnodes:
                p.nnodes = nn
        self._note("comm", text, line, source)

    def _env(self, msg: str) -> None:
        m = _ENV.match(msg)
        if m:
            self.env[m.group(1)] = m.group(2)
            if m.group(1) == "NCCL_IB_HCA" or (m.group(1) == "NCCL_IB_DISABLE" and m.group(2).strip() == "0"):
                self.ib_expected = True

    def _channel(self, proc: _Proc | None, ch: re.Match[str], text: str, line: int, source: str) -> None:
        """Rules net-channel (traffic over a network) and channel (P2P/SHM/NVLS inside a host)."""
        src, dst, direction = int(ch.group(1)), int(ch.group(2)), ch.group(3)
        via = ch.group(4)
        for cut in (" comm 0x", " nRanks"):
            k = via.find(cut)
            if k >= 0:
                via = via[:k]
        via = via.strip()
        own = dst if direction == "receive" else src
        if proc is not None and proc.twins and own in proc.twins:
            proc = proc.twins[own]
        p = proc or self._rank_proc(own)
        net = _NET_TRANSPORT.match(via) if via.startswith("NET/") else None
        if net:
            name, flags = net.group(1), net.group(3)
            p.nets.add(name)
            p.transports.add("NET/" + name + ("/GDRDMA" if "GDRDMA" in flags else ""))
            if "GDRDMA" in flags:
                p.gdr = True
            self._note("net-channel", text, line, source)
        else:
            p.transports.add(_transport_word(via))
            self._note("channel", text, line, source)

    def _ofi(self, tgt: _Proc, msg: str, text: str, line: int, source: str) -> None:
        m = _PROVIDER.search(msg)
        if m:  # rule provider
            self.provider_sources.add(source)
            tgt.provider = m.group(1)
            tgt.fabric = m.group(2)
            if ("provider", "Libfabric") not in tgt.choices:
                tgt.choices.append(("provider", "Libfabric"))
            if not tgt.plugin:
                tgt.plugin = "aws-ofi-nccl"
            self._note("provider", text, line, source)
            return
        m = _OFI_VERSION.search(msg)
        if m:
            tgt.plugin, tgt.plugin_version = "aws-ofi-nccl", m.group(1)
            self._note("plugin", text, line, source)
            return
        if msg.startswith("NET/OFI Setting provider_filter to efa") or msg.startswith("NET/OFI Forcing AWS OFI ndev"):
            tgt.implied_provider = "efa"  # rule efa-wording
            if not tgt.plugin:
                tgt.plugin = "aws-ofi-nccl"
            self._note("efa-wording", text, line, source)
            return
        self._note("ofi", text, line, source)

    def _plugin(self, tgt: _Proc, msg: str, text: str, line: int, source: str) -> None:
        if tgt.choices == [("probe", "Socket")]:
            # NCCL 2.4.0-2.4.7 initialised Socket for its bootstrap before looking for a
            # plugin (src/init.cu initNet); a Socket line before "NET/Plugin" is that one.
            tgt.choices.clear()
            tgt.boot_socket = True
        m = _LOADED_PLUGIN.search(msg)
        if m:
            tgt.plugin, tgt.plugin_version = m.group(1), m.group(2)
            self._note("plugin", text, line, source)
            return
        m = _P2P_PLUGIN.match(msg)
        if m:
            tgt.plugin = tgt.plugin or f"HPC-X {m.group(1)}"
            if m.group(1).lower().startswith("ib"):
                self.ib_expected = True
            self._note("plugin", text, line, source)
            return
        if msg.startswith("Plugin Path"):
            self._note("plugin", text, line, source)
            return
        m = _REQUESTED_PLUGIN_MISSING.search(msg)
        if m:  # NCCL_NET_PLUGIN named a plugin that is not there
            self.plugin_failed = True
            if "ofi" in (m.group(2) or m.group(3) or "").lower():
                self.ofi_failed = True
                tgt.ofi_failed = True
            self._fail("plugin", text, line, source)
            self._note("plugin-failure", text, line, source)
            return
        so = _SO_PROBLEM.search(msg)
        if so:
            missing_plugin = so.group(2).startswith("cannot open") and so.group(1).rsplit("/", 1)[-1] == "libnccl-net.so"
            if missing_plugin:
                tgt.plugin = tgt.plugin or "internal"
                self._note("plugin", text, line, source)
            else:
                self.plugin_failed = True
                self._fail("plugin", text, line, source)
                self._note("plugin-failure", text, line, source)
            return
        if "ncclNetPlugin symbol (>=" in msg or "Failed to initialize" in msg:
            self.plugin_failed = True
            self._fail("plugin", text, line, source)
            self._note("plugin-failure", text, line, source)
            return
        if "No plugin found" in msg or "Could not find: libnccl-net" in msg:
            tgt.plugin = tgt.plugin or "internal"
            self._note("plugin", text, line, source)

    def _warn(self, proc: _Proc | None, msg: str, text: str, line: int, source: str) -> None:
        self._error(proc, text, line, source)
        self._note("warn", text, line, source)
        low = msg.lower()
        if msg.startswith("Duplicate GPU detected"):
            self.duplicate_gpu = True  # those ranks are on one host: never split them by bus id
        if "net/ofi" in low or "ofi" in low.split(" ", 1)[0] or "aws-ofi-nccl" in low:
            self.ofi_failed = True  # rule ofi-failure
            (proc or self.glob).ofi_failed = True
            self._fail("ofi", text, line, source)
        elif "net plugin" in low and "fail" in low:
            self.plugin_failed = True
            self._fail("plugin", text, line, source)
        elif msg.startswith("Error: network") and "not found" in msg:
            self.net_missing = msg.split("network", 1)[1].replace("not found", "").strip(" .")
            self._fail("network", text, line, source)
        elif "NET/IB" in msg and ("No device" in msg or "nable to open" in msg or "ibv_open" in msg):
            self.ib_failed = True
            self._fail("ib", text, line, source)

    def _other(self, proc: _Proc | None, msg: str, text: str, line: int, source: str) -> None:
        lf = _LIBFABRIC.search(text)
        if lf:  # rule libfabric
            self._note("libfabric", text, line, source)
            body = lf.group(4).lower()
            if lf.group(1) in ("efa", "efa-direct") and lf.group(2) in _LIBFABRIC_EP_SUBSYS and self.provider_hint is None:
                self.provider_hint = Evidence("provider", source, self._ln(line), text.strip())
            if ("provider efa" in body and "empty" in body) or (lf.group(1) == "efa" and ("no efa" in body or "failed to open" in body)):
                self.efa_failed = True
                self._fail("efa", text, line, source)
            return
        if _APP_ERROR.search(text):
            self._error(proc, text, line, source)
            self._note("error", text, line, source)
            self.context_wanted = ERROR_CONTEXT_LINES

    def feed_context(self, text: str, line: int = -1, source: str = "-") -> None:
        """A line after a PyTorch "NCCL error": `ncclSystemError: …`, `Last error:` and its cause."""
        self.context_wanted -= 1
        text = text.strip()
        if text and not text.startswith(("File ", "Traceback", "^")):
            self._error(None, text, line, source)

    # -- conclusion -------------------------------------------------------------------
    def _chosen(self, p: _Proc) -> tuple[list[str], str | None]:
        """The network a process reported choosing, and the rule that says so, strongest first."""
        if p.selected:  # rule network: NCCL's own word
            return p.selected, "network"
        if p.inits:  # rule net-init: the first plugin to initialise is assigned (NCCL >= 2.27)
            return p.inits, "net-init"
        pinned = self.env.get("NCCL_NET", "").strip().lower()
        failed = p.ofi_failed or self.glob.ofi_failed
        old_24 = _is_nccl_240_247(p.version or self.glob.version)
        if (p.boot_socket or old_24) and p.ib_absent and ("probe", "Socket") not in p.choices and not p.provider:
            return ["Socket"], "probe"  # 2.4.0-2.4.7: IB absent, so the bootstrap Socket carries the job
        for rule, name in reversed(p.choices):
            # Rules ib-init/socket-init/provider: NCCL initialises plugin, IB, Socket in turn and
            # keeps the first that works, so the last of them in the log is where it stopped.
            # (NCCL 2.4.0-2.4.7 also initialised Socket first for its bootstrap, before the
            # others: src/init.cu initNet, so a later IB or plugin line still wins.)
            if rule == "provider":
                # The efa-wording lines come before the provider search, so only this line
                # says the plugin came up; a failure after it undoes that.
                if not failed and (not pinned or "libfabric" in pinned or "ofi" in pinned):
                    return [name], rule
            elif old_24 and name == "Socket" and not p.ib_absent:
                continue  # 2.4.0-2.4.7 printed this for its bootstrap whatever the network
            elif not pinned or name.lower() == pinned:
                return [name], rule
        return [], None

    def _hosts(self, procs: list[_Proc], nnodes_decl: int | None) -> list[HostInfo]:
        """Machines: hostnames, split by the addresses NCCL printed, counted up by clashes."""
        named = [p for p in procs if p.node and not p.key.startswith("rank ")]
        owner: dict[str, set[str]] = {}
        for p in named:
            if p.node != p.ip:
                for a in p.all_addrs():
                    owner.setdefault(a, set()).add(p.node or "")

        def name_of(p: _Proc) -> str:
            # A Ray-only prefix names the node by IP: it is the host whose NCCL lines show that IP.
            if p.node == p.ip and p.ip and len(owner.get(p.ip, ())) == 1:
                return next(iter(owner[p.ip]))
            return p.node or ""

        groups: dict[str, list[_Proc]] = {}
        given: dict[str, list[_Proc]] = {}
        for p in named:
            g = p.addrs.get("given")
            if g:  # the caller said which machine this came from: that settles it
                given.setdefault(next(iter(g[0])), []).append(p)
            else:
                groups.setdefault(name_of(p), []).append(p)
        out: list[HostInfo] = []
        for node, ps in given.items():
            names = _uniq([p.node for p in ps if p.node != node]) or [node]
            out.append(HostInfo(host=node, name=", ".join(names), addresses=sorted({a for p in ps for a in p.all_addrs()} - {node}),
                                machines=1, processes=sorted(p.key for p in ps), ranks=sorted({p.rank for p in ps if p.rank is not None}),
                                inter_node=None, proof=None, why=["named by the caller (logs grouped per machine)"], told_by="caller"))
        for name, ps in groups.items():
            clusters = _split_by_address(ps)
            for addrs, members in clusters:
                machines, why = _machines_in(members, not self.duplicate_gpu) if addrs is not None else (0, [])
                if addrs is None:
                    why = ["these processes printed no address: they run on one of the machines above"]
                label = name if len(clusters) == 1 else f"{name} ({sorted(addrs)[0]})" if addrs else f"{name} (no address)"
                if len(clusters) > 1 and addrs:
                    why.insert(0, f"hostname {name!r} is shared by machines with different addresses; this one: {', '.join(sorted(addrs))}")
                out.append(HostInfo(host=label, name=name, addresses=sorted(addrs or ()), machines=machines,
                                    processes=sorted(p.key for p in members), ranks=sorted({p.rank for p in members if p.rank is not None}),
                                    inter_node=None, proof=None, why=why, told_by="addresses" if len(clusters) > 1 else "hostname"))
        if len(out) == 1 and out[0].told_by == "hostname" and nnodes_decl and nnodes_decl > out[0].machines:
            out[0].machines = nnodes_decl
            out[0].why.append(f"one hostname, but the communicator reports nNodes {nnodes_decl} (NCCL counts hosts by host hash, not name)")
        return out

    def report(self) -> NcclReport:
        if self.ib_nodev is not None and self.ib_expected and not self.ib_failed:
            self.ib_failed = True
            self._fail("ib", self.ib_nodev.text, self.ib_nodev.line, self.ib_nodev.source)
        procs = list(self.procs.values())
        g = self.glob
        every = procs + [g]
        versions = _uniq([p.version for p in every])
        providers = _uniq([p.provider for p in every])
        hinted: str | None = None
        if not providers:
            if any(p.implied_provider for p in every):
                providers, hinted = ["efa"], "the plugin's EFA-only wording (Setting provider_filter to efa / Forcing AWS OFI ndev)"
            elif self.provider_hint is not None:
                providers, hinted = ["efa"], f"libfabric's efa endpoint log, line {self.provider_hint.line}"
        fabrics = _uniq([p.fabric for p in every])
        plugins = _uniq([p.plugin for p in every])
        plugin_versions = _uniq([p.plugin_version for p in every])
        one_provider = providers[0] if len(providers) == 1 else None

        def prov_of(p: _Proc) -> str | None:
            return p.provider or p.implied_provider or one_provider

        chosen = {p.key: self._chosen(p) for p in every}
        selected = _uniq([n for p in every for n in chosen[p.key][0]])
        nets = sorted({n for p in every for n in p.nets})
        carried: dict[str, list[str]] = {}
        sel_only: dict[str, list[str]] = {}
        for p in every:
            prov = prov_of(p)
            if p.nets:
                for c in sorted({net_class(n, prov) for n in p.nets}):
                    carried.setdefault(c, []).append(p.key)
            else:
                for c in sorted({net_class(n, prov) for n in chosen[p.key][0]}):
                    sel_only.setdefault(c, []).append(p.key)

        nnodes_decl = max([p.nnodes for p in every if p.nnodes] or [0]) or None
        hosts = self._hosts(procs, nnodes_decl)
        machines = sum(h.machines for h in hosts)
        nodes = max(nnodes_decl or 0, machines) or None
        any_channel = any(p.transports for p in every)
        ranked = [p for p in every if p.nranks]
        one_rank = bool(ranked) and all(p.nranks == 1 for p in ranked)

        reasons: list[str] = []
        classes: dict[str, list[str]] = {}
        proof: str | None = None
        verdict = "unknown"
        single = machines <= 1 and (nnodes_decl or 1) <= 1 and (any_channel or nnodes_decl == 1 or one_rank)
        if carried:
            classes = {c: list(k) for c, k in carried.items()}
            if (nnodes_decl or 0) >= 2:  # a multi-node communicator: every rank's choice counts
                for c, keys in sel_only.items():
                    keys = [k for k in keys if k != "*"]
                    if keys:
                        classes.setdefault(c, []).extend(keys)
            proof = "carried" if len(carried) == len(classes) else "selected"
        elif single:
            verdict, proof = "single-node", ("carried" if any_channel else "selected")
            if any_channel:
                reasons.append("no channel crossed a network: all peers connected over P2P/SHM/NVLS on one host")
            else:
                reasons.append(("communicators report nNodes 1" if nnodes_decl == 1 else "every communicator has a single rank")
                               + "; no channel lines, so the traffic itself is not in the log")
            if selected:
                reasons.append(f"NCCL selected {', '.join(selected)}, but nothing crossed it")
        elif sel_only:
            classes, proof = sel_only, "selected"

        if classes:
            if len(classes) > 1:
                verdict = "mixed"
                reasons.append("ranks disagree: " + "; ".join(f"{c}: {', '.join(k[:6])}{' …' if len(k) > 6 else ''}" for c, k in sorted(classes.items())))
            else:
                c = next(iter(classes))
                names = ", ".join(nets) if carried else ", ".join(selected)
                if c == "libfabric?":
                    proof = None
                    reasons.append(f"the OFI plugin's network ({names}) {'carried the traffic' if carried else 'was selected'}, but the log never "
                                   "says which provider it used: 'Libfabric' is the plugin's name for any provider, not proof of EFA")
                elif c in ("unknown", "mixed"):
                    verdict, proof = c if c == "mixed" else "unknown", None
                    reasons.append("inter-node traffic over an unrecognised network: " + (names or "?"))
                else:
                    verdict = c
                    if proof == "carried":
                        reasons.append(f"inter-node traffic over {names} per channel lines")
                    else:
                        reasons.insert(0, self._selected_sentence(every, chosen, any_channel))
                    if c in ("efa", "libfabric-other"):
                        reasons.append(f"OFI provider: {', '.join(providers)}" + (f" (from {hinted})" if hinted else ""))
                    if c == "ib" and any(p.roce for p in every):
                        reasons.append("the IB transport runs over RoCE (the device list says /RoCE)")
        elif verdict == "unknown":
            if any_channel and machines > 1:
                reasons.append(f"{machines} machines, but the log shows only intra-node channels (P2P/SHM): the inter-node connections are not in it")
            else:
                reasons.append("no channel lines, no network selection and no multi-node communicator in the log: not enough evidence"
                               if (versions or procs or self.errors) else "no NCCL output found (is NCCL_DEBUG=INFO set?)")
        if nnodes_decl and nnodes_decl > 1:
            reasons.append(f"a communicator reports nNodes {nnodes_decl}")
        shared: dict[str, list[HostInfo]] = {}
        for h in hosts:
            if h.told_by == "addresses" and h.addresses:
                shared.setdefault(h.name, []).append(h)
        for name, hs in shared.items():
            reasons.append(f"{len(hs)} machines share the hostname {name!r}, told apart by the addresses NCCL printed: "
                           + "; ".join(", ".join(h.addresses) for h in hs))
        for h in hosts:
            if h.machines > 1:
                reasons.append(f"{h.host}: {h.machines} machines — " + "; ".join(h.why[1:] if h.told_by == "addresses" else h.why))

        attempted = self._attempted(chosen)
        landed = verdict if verdict in _SPEED else None
        if landed is None and selected:
            sel = {net_class(n, one_provider) for n in selected}
            if len(sel) == 1 and next(iter(sel)) in _SPEED:
                landed = next(iter(sel))
        fallback = bool(attempted and landed and _SPEED[landed] < _SPEED[attempted])
        if fallback:
            reasons.append(f"fallback: {attempted} failed and NCCL went on with {landed}")
        elif attempted and not landed:
            reasons.append(f"{attempted} failed (see failures) and the log does not show what NCCL used instead")
        if self.repeated:
            reasons.append(f"Ray folded {self.repeated} repeated lines ('[repeated Nx across cluster]'): those ranks are not all listed; "
                           "set RAY_DEDUP_LOGS=0 or read the session logs for every rank")
        if self.net_missing:
            reasons.append(f"NCCL_NET asks for network {self.net_missing!r}, which NCCL could not find: the job stopped instead of falling back")
        if verdict == "mixed" and attempted and any(_SPEED.get(c, 9) < _SPEED[attempted] for c in classes):
            fallback = True
            reasons.append(f"fallback on some ranks: {attempted} failed there")

        host_of = {k: h.host for h in hosts for k in h.processes}
        rank_rows: list[RankInfo] = []
        for p in sorted(procs, key=_proc_order):
            prov = prov_of(p)
            inter: str | None = None
            rproof: str | None = None
            if p.nets:
                cs = sorted({net_class(n, prov) for n in p.nets})
                inter, rproof = (cs[0] if len(cs) == 1 else "mixed"), "carried"
            elif verdict != "single-node" and chosen[p.key][0]:
                cs = sorted({net_class(n, prov) for n in chosen[p.key][0]})
                inter, rproof = (cs[0] if len(cs) == 1 else "mixed") + "*", "selected"
            names = chosen[p.key][0]
            rank_rows.append(
                RankInfo(
                    key=p.key, rank=p.rank, nranks=p.nranks or None, node=p.node, ip=p.ip or _primary_addr(p), pid=p.pid,
                    device=p.device, nccl_version=p.version or g.version, plugin=p.plugin or (plugins[0] if len(plugins) == 1 else None),
                    provider=prov, fabric=p.fabric, network=(names[-1] if names else (selected[0] if len(selected) == 1 else None)),
                    transports=sorted(p.transports), inter_node=inter, gdr=(p.gdr if p.nets else None), errors=p.errors,
                    proof=rproof, host=host_of.get(p.key),
                )
            )
        rows_by_key = {r.key: r for r in rank_rows}
        for h in hosts:
            rows = [rows_by_key[k] for k in h.processes if k in rows_by_key and rows_by_key[k].inter_node]
            cs = {r.inter_node.rstrip("*") for r in rows if r.inter_node}
            if cs:
                h.inter_node = next(iter(cs)) if len(cs) == 1 else "mixed"
                h.proof = "carried" if any(r.proof == "carried" for r in rows) else "selected"

        gdr: bool | None = None
        net_procs = [p for p in every if p.nets]
        if net_procs:
            gdr = all(p.gdr for p in net_procs)

        report = NcclReport(
            verdict=verdict, proof=proof if verdict != "unknown" else None, fallback=fallback,
            fallback_from=attempted if fallback else None, gdr=gdr,
            nccl_version=", ".join(versions) or None,
            plugin=", ".join(plugins) or None,
            plugin_version=", ".join(plugin_versions) or None,
            provider=", ".join(providers) or None,
            fabric=", ".join(fabrics) or None,
            network=", ".join(selected) or None,
            nodes=nodes, ranks=rank_rows, errors=self.errors, evidence=sorted(self.evidence, key=lambda e: (e.source, e.line)),
            failures=self.failures, reasons=reasons, causes=[], env=dict(self.env), sources=list(self.sources),
            lines=self.lines, candidates=self.candidates, folded_repeats=self.repeated, hosts=hosts,
        )
        report.causes = likely_causes(report)
        return report

    def _selected_sentence(self, every: list[_Proc], chosen: dict[str, tuple[list[str], str | None]], any_channel: bool) -> str:
        """Say in words what was selected, by whom, and why that is not proof of traffic."""
        by_rule: dict[str, list[str]] = {}
        for p in every:
            names, rule = chosen[p.key]
            if rule:
                for n in names:
                    if n not in by_rule.setdefault(rule, []):
                        by_rule[rule].append(n)
        parts = []
        if "network" in by_rule:
            parts.append(f"NCCL selected {', '.join(by_rule['network'])}")
        if "net-init" in by_rule:
            parts.append(f"NCCL initialised the {', '.join(by_rule['net-init'])} net plugin (the first to initialise is assigned)")
        if "probe" in by_rule:
            parts.append(f"NCCL's {', '.join(by_rule['probe'])} transport initialised with devices (taken when no plugin was)")
        if "provider" in by_rule:
            provs = _uniq([p.provider for p in every if chosen[p.key][1] == "provider"])
            parts.append(f"the OFI plugin came up with provider {', '.join(provs)} (NCCL takes a plugin that initialises)")
        gap = "no channel line crosses a network" if any_channel else "no channel lines"
        return (f"{'; '.join(parts) or 'a network was selected'}; {gap}, so traffic is not proven — "
                "run with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET to see them")

    def _attempted(self, chosen: dict[str, tuple[list[str], str | None]]) -> str | None:
        """The faster transport that the log shows failing (or present but unused), if any."""
        if self.ofi_failed or self.efa_failed:
            return "efa"
        if self.env.get("NCCL_NET", "").strip().lower().startswith("socket"):
            return None  # sockets on purpose
        every = list(self.procs.values()) + [self.glob]
        plugins = {p.plugin for p in every if p.plugin}
        # The OFI plugin was there (its lines, a provider) on a machine whose traffic went over sockets.
        ofi_nodes = {p.node for p in every if p.provider or p.implied_provider or (p.plugin and _is_ofi(p.plugin))}
        socket_nodes = self._socket_nodes(chosen)
        if ofi_nodes and socket_nodes and (None in ofi_nodes or ofi_nodes & socket_nodes):
            return "efa"
        if self.plugin_failed:
            texts = " ".join(e.text.lower() for e in self.failures)
            ofi = any(p.plugin == "aws-ofi-nccl" for p in self.procs.values()) or "ofi" in texts or "libfabric" in texts
            return "efa" if ofi else "net plugin"
        if self.ib_failed or (self.ib_nodev is not None and self.ib_expected):
            return "ib"
        if any(p.startswith("HPC-X") for p in plugins) and self._socket_nodes(chosen):
            return "ib"
        return None

    def _socket_nodes(self, chosen: dict[str, tuple[list[str], str | None]]) -> set[str | None]:
        """Hosts (None: unprefixed lines) whose traffic went over sockets, or that chose sockets when no traffic is shown."""
        every = list(self.procs.values()) + [self.glob]
        carried = any(p.nets for p in every)
        return {p.node for p in every if any(n.lower().startswith("socket") for n in (p.nets if carried else chosen[p.key][0]))}


def _is_ofi(plugin: str) -> bool:
    return plugin == "aws-ofi-nccl" or "libfabric" in plugin.lower()


def _is_nccl_240_247(version: str | None) -> bool:
    m = re.match(r"2\.4\.(\d+)", version or "")
    return bool(m) and int(m.group(1)) <= 7


def _split_by_address(ps: list[_Proc]) -> list[tuple[set[str] | None, list[_Proc]]]:
    """Processes of one hostname, grouped into machines by the addresses they printed.

    Processes that share an address are one machine. Groups stay apart only when they are
    provably different: both printed an address of the same kind (bootstrap, socket, ib,
    ray, or one interface name) and those addresses differ. Processes without any address
    join their pid's machine or the only machine, or stand apart (address None).
    """
    clusters: list[tuple[dict[str, set[str]], list[_Proc]]] = []
    bare: list[_Proc] = []
    for p in ps:
        if not p.addrs:
            bare.append(p)
            continue
        kinds = {k: set().union(*v) for k, v in p.addrs.items()}
        members = [p]
        rest = []
        for ck, ms in clusters:
            if set().union(*kinds.values()) & set().union(*ck.values()):
                for k, v in ck.items():
                    kinds.setdefault(k, set()).update(v)
                members.extend(ms)
            else:
                rest.append((ck, ms))
        clusters = [*rest, (kinds, members)]
    changed = True
    while changed and len(clusters) > 1:
        changed = False
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                a, b = clusters[i][0], clusters[j][0]
                if not any(k in b and not (a[k] & b[k]) for k in a):
                    for k, v in b.items():
                        a.setdefault(k, set()).update(v)
                    clusters[i][1].extend(clusters[j][1])
                    del clusters[j]
                    changed = True
                    break
            if changed:
                break
    out: list[tuple[set[str] | None, list[_Proc]]] = [(set().union(*ck.values()), ms) for ck, ms in clusters]
    if bare and len(out) > 1:
        # One pid is one process, and one process is on one machine: a process's other GPUs
        # (same pid, another [dev]) go where its addressed lines went.
        pids = [{p.pid for p in ms} for _, ms in out]
        rest = []
        for p in bare:
            homes = [i for i, pidset in enumerate(pids) if p.pid in pidset]
            if len(homes) == 1:
                out[homes[0]][1].append(p)
            else:
                rest.append(p)
        bare = rest
    if bare:
        if len(out) == 1:
            out[0][1].extend(bare)
        elif not out:
            out.append((set(), bare))
        else:
            out.append((None, bare))
    return out


def _machines_in(members: list[_Proc], trust_bus_ids: bool = True) -> tuple[int, list[str]]:
    """How many machines one address group must be, from what NCCL would never print on one.

    `trust_bus_ids=False` when NCCL itself warned "Duplicate GPU detected": then two ranks on
    one bus id really are on one host (and init failed), so they count as one machine.
    """
    n, why = 1, []
    for p in members:
        for kind, sets in p.addrs.items():
            apart = _disjoint_count(sets)
            if kind != "given" and apart > 1:
                n = max(n, apart)
                what = f"addresses for interface {kind[3:]}" if kind.startswith("if:") else f"{kind} addresses"
                why.append(f"{p.key} printed {apart} different {what} ({', '.join(sorted(a for s in sets for a in s))}), "
                           "which one process prints once: same hostname and pid on different machines")
        if p.twins:
            n = max(n, 1 + len(p.twins))
            why.append(f"{p.key} holds ranks {', '.join(str(r) for r in sorted([p.rank or 0, *p.twins]))} of one communicator: "
                       "one process is one rank per communicator, so these are different machines")
    by_comm: dict[str, dict[int, str | None]] = {}
    local: dict[str, int] = {}
    for p in members:
        for cid, (rank, bus) in p.joined.items():
            by_comm.setdefault(cid, {})[rank] = bus
        local.update(p.local_ranks)
    for cid, ranks in by_comm.items():
        buses: dict[str, list[int]] = {}
        for r, b in ranks.items():
            if b:
                buses.setdefault(b, []).append(r)
        dup = max((len(v) for v in buses.values()), default=1)
        if dup > 1 and trust_bus_ids:
            n = max(n, dup)
            b, rs = max(buses.items(), key=lambda kv: len(kv[1]))
            why.append(f"ranks {', '.join(map(str, sorted(rs)))} of communicator {cid} share GPU bus id {b}: NCCL refuses that on one host")
        lr = local.get(cid)
        if lr and len(ranks) > lr:
            need = -(-len(ranks) // lr)
            if need > n:
                n = need
                why.append(f"{len(ranks)} ranks of communicator {cid} under one name, but localRanks is {lr}")
    return n, why


def _disjoint_count(sets: list[frozenset[str]]) -> int:
    """How many of these address sets share nothing with each other (a process prints one)."""
    picked: list[frozenset[str]] = []
    for s in sets:
        if all(not (s & t) for t in picked):
            picked.append(s)
    return len(picked)


def _primary_addr(p: _Proc) -> str | None:
    for kind in ("bootstrap", "socket", "ib", "ray"):
        sets = p.addrs.get(kind)
        if sets:
            return sorted(sets[0])[0]
    return None


def _last_segment(text: str) -> str:
    """CloudWatch exports show `time | message` and sometimes `message | message`."""
    parts = [s for s in text.split(" | ") if s.strip()]
    for s in reversed(parts):
        if "NCCL" in s or "nccl" in s or "libfabric" in s:
            return s
    return parts[-1] if parts else text


def _transport_word(via: str) -> str:
    via = via.strip()
    if via.startswith("direct shared memory"):  # NCCL 2.4's name for SHM
        return "SHM"
    for word in ("P2P/CUMEM", "P2P/IPC", "P2P/direct pointer", "P2P/direct", "SHM", "NVLS", "CollNet", "P2P"):
        if via.startswith(word):
            return word
    return via.split(" ", 1)[0]


def _uniq(items: Iterable[str | None]) -> list[str]:
    out: list[str] = []
    for i in items:
        if i and i not in out:
            out.append(i)
    return out


def _proc_order(p: _Proc) -> tuple[int, str]:
    return (p.rank if p.rank is not None else 1 << 30, p.key)


def expect_ok(r: NcclReport, expect: str, accept_selected: bool = False) -> bool:
    """The gate: this verdict, carried by traffic (or only selected, if accepted), no fallback, no error."""
    proven = r.proof == "carried" or (accept_selected and r.proof == "selected")
    return r.verdict == expect and proven and not r.fallback and not r.errors


def likely_causes(r: NcclReport) -> list[str]:
    """What to check when the log shows a fallback or no EFA, in the order worth checking."""
    out: list[str] = []
    if not (r.fallback or r.verdict in ("socket", "libfabric-other", "mixed") or r.failures):
        return out
    texts = " ".join(e.text for e in r.failures).lower()
    if any(e.kind == "network" for e in r.failures):
        out.append("NCCL_NET names a network that is not there: for EFA the plugin must load (NCCL_NET=Libfabric needs libnccl-net-ofi.so on LD_LIBRARY_PATH or NCCL_NET_PLUGIN=ofi)")
    if r.fallback_from == "ib":
        out.append("InfiniBand/RoCE failed: is /dev/infiniband mounted in the container (RDMA device plugin or privileged)? Does NCCL_IB_HCA name a present HCA? Is nvidia-peermem loaded for GPUDirect?")
    if "empty list" in texts or "fi_getinfo" in texts or "no eligible" in texts or "optimal provider" in texts:
        out.append("no EFA device visible in the container: is /dev/infiniband/uverbs* mounted? Does the pod request vpc.amazonaws.com/efa? Is the EFA device plugin DaemonSet ready on the node?")
    if "version `" in texts or "cannot open shared object" in texts or "undefined symbol" in texts:
        out.append("the net plugin could not be loaded: libfabric / aws-ofi-nccl versions in the image do not match (check LD_LIBRARY_PATH and /opt/amazon/efa/lib)")
    if r.provider and r.provider.split(";")[0] not in ("efa", "efa-direct"):
        out.append(f"the OFI plugin selected provider {r.provider!r}, not efa: check FI_PROVIDER=efa and that fi_info -p efa lists a device")
    if r.fallback_from != "ib" and (r.verdict in ("socket", "mixed") or r.fallback):
        out.append("EFA resource requested by the pod (vpc.amazonaws.com/efa in limits)? device plugin ready (kubectl get ds -n kube-system aws-efa-k8s-device-plugin)?")
        out.append("FI_PROVIDER=efa set in the worker environment? /dev/infiniband mounted in the container?")
        if "NCCL_NET" not in r.env:
            out.append("NCCL_NET is not pinned: set NCCL_NET=Libfabric (or 'AWS Libfabric' on older plugins) so a missing EFA fails loudly instead of falling back to sockets")
    if r.verdict == "mixed":
        out.append("ranks disagree: compare the nodes in the table; one node's EFA device or plugin differs from the others")
    return out


# ---------------------------------------------------------------------------------------
def candidate_lines(chunk: bytes, start: int = 0, end: int | None = None, libfabric: bool = True) -> Iterator[tuple[int, int]]:
    """(start, end) of each line in `chunk[start:end]` that can carry evidence, in order, once each.

    Works on offsets, never slices, so an 8 MB chunk is not copied to be searched.
    `libfabric=False` skips the pass for libfabric's own warnings.
    """
    if end is None:
        end = len(chunk)
    rfind, find = chunk.rfind, chunk.find
    others: list[int] = []
    for literal, rx in _CAND_OTHER if libfabric else ():
        i = find(literal, start, end)
        while i >= 0:
            if rx.match(chunk, i, end):
                others.append(i)
            i = find(literal, i + len(literal), end)
    if others:
        starts: Iterable[int] = sorted([m.start() for m in _CAND_NCCL.finditer(chunk, start, end)] + others)
    else:
        starts = (m.start() for m in _CAND_NCCL.finditer(chunk, start, end))
    last_end = -1
    for s in starts:
        if s < last_end:
            continue
        b = rfind(b"\n", start, s) + 1 or start
        e = find(b"\n", s, end)
        if e < 0:
            e = end
        last_end = e + 1
        yield b, e


class ChunkScanner:
    """Feeds byte chunks (any sizes) to a parser, tracking line numbers across chunks.

    Newlines are counted with numpy into a reused buffer (a `bytes.count` pass costs as
    much as the whole search), and a candidate's line number is only computed when the
    parser keeps that line as evidence.
    """

    MAX_LINE = 8 << 20

    def __init__(self, parser: NcclParser, source: str = "-", node: str | None = None) -> None:
        self.parser = parser
        self.source = source
        self.node = node  # the machine this stream came from, when the caller knows it
        self._tail = b""
        self._line = 0  # newlines before the current chunk
        self._eq: Any = None  # numpy bool buffer, reused across chunks
        parser._last_text = ""
        if source not in parser.sources:
            parser.sources.append(source)

    def feed(self, data: bytes) -> None:
        start = 0
        if self._tail:
            nl = data.find(b"\n")
            if nl < 0:
                self._tail = (self._tail + data)[-self.MAX_LINE:]
                return
            head = self._tail + data[: nl + 1]
            self._tail = b""
            self._scan(head, 0, len(head))
            start = nl + 1
        cut = data.rfind(b"\n", start) + 1
        if cut <= start:
            self._tail = data[start:][-self.MAX_LINE:]
            return
        self._scan(data, start, cut)
        self._tail = data[cut:]

    def close(self) -> None:
        if self._tail:
            tail, self._tail = self._tail + b"\n", b""
            self._scan(tail, 0, len(tail))

    def _scan(self, data: bytes, start: int, end: int) -> None:
        if end - start >= NUMPY_MIN:
            np = _numpy()
            n = end - start
            if self._eq is None or len(self._eq) < n:
                self._eq = np.empty(max(n, 1 << 20), dtype=bool)
            eq = self._eq[:n]
            np.equal(np.frombuffer(data, dtype=np.uint8, count=n, offset=start), 10, out=eq)

            def newlines(a: int, b: int) -> int:
                return int(np.count_nonzero(eq[a - start : b - start]))
        else:

            def newlines(a: int, b: int) -> int:
                return data.count(b"\n", a, b)

        parser, source = self.parser, self.source
        state = [start, self._line]  # position counted up to, newlines before it
        off = start

        def line_of() -> int:
            if off > state[0]:
                state[1] += newlines(state[0], off)
                state[0] = off
            return state[1] + 1

        parser._line_of = line_of
        parser.node_hint = self.node
        seen, find, startswith = parser._chan_bytes_seen, data.find, data.startswith
        node = (self.node or "").encode() + b"\x00" if self.node else b""
        if len(seen) > 1_000_000:
            seen.clear()
        try:
            # libfabric's warnings matter while the OFI provider is unknown: once the plugin has
            # named it in this stream, the (costly) extra pass is skipped.
            libfabric = source not in parser.provider_sources
            consumed = start
            for b, e in candidate_lines(data, start, end, libfabric):
                if b < consumed:
                    continue  # already read as context of an error
                # An INFO line already parsed (a restarted worker group prints its init again)
                # adds nothing, and channel lines repeat per channel number: one equal to a parsed
                # one except for that number adds nothing either. Ray's folds are always counted.
                i = find(b" NCCL INFO ", b, e)
                if i >= 0 and find(b"x across cluster]", i, e) < 0:
                    j = find(b" : ", i, e) if startswith(b"Channel ", i + 11) else -1
                    key = node + (data[b:i] + data[j:e] if j >= 0 else data[b:e])
                    if key in seen:
                        continue
                    seen.add(key)
                off = b
                parser.feed_line(data[b:e].decode("utf-8", "replace"), -1, source)
                while parser.context_wanted > 0 and e < end:
                    b, e = e + 1, find(b"\n", e + 1, end)
                    if e < 0:
                        e = end
                    off = b
                    parser.feed_context(data[b:e].decode("utf-8", "replace"), -1, source)
                    consumed = e + 1
        finally:
            parser._line_of = None
            parser.node_hint = None
        total = newlines(start, end)
        self._line += total
        parser.lines += total


# Below this many bytes, bytes.count is cheaper than importing numpy (~0.15 s); above it,
# numpy's vectorised compare counts newlines ~7x faster.
NUMPY_MIN = 4 << 20


def _numpy() -> Any:
    import numpy

    return numpy


def analyze_chunks(chunks: Iterable[bytes], source: str = "-", parser: NcclParser | None = None, node: str | None = None) -> NcclReport:
    """Report for one stream of raw bytes; pass `parser` to combine several streams.

    `node` names the machine the stream came from (a pod, an instance) when the caller knows
    it: processes are then told apart by it too, and `report().hosts` is per that machine.
    """
    p = parser or NcclParser()
    sc = ChunkScanner(p, source, node)
    for c in chunks:
        sc.feed(c)
    sc.close()
    return p.report()


def analyze_lines(lines: Iterable[str | bytes], source: str = "-", node: str | None = None) -> NcclReport:
    """Report for an iterable of text lines (each parsed only if it can carry evidence)."""
    p = NcclParser()
    p.sources.append(source)
    p.node_hint = node
    n = 0
    for n, raw in enumerate(lines, 1):
        b = raw if isinstance(raw, bytes) else raw.encode("utf-8", "replace")
        if p.context_wanted > 0:
            p.feed_context(b.decode("utf-8", "replace"), n, source)
            continue
        for s, e in candidate_lines(b):
            p.feed_line(b[s:e].decode("utf-8", "replace"), n, source)
    p.lines = n
    return p.report()
