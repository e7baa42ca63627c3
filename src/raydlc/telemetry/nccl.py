"""Which transport really carried a job, read from NCCL's own debug output.

NCCL falls back silently: when the OFI plugin or the EFA device fails it picks InfiniBand,
then plain sockets, and the job still trains, at half speed. A grep for "Libfabric" cannot
tell the difference, because NCCL names the *selected* network long before any byte crosses
it, and the plugin names the network "Libfabric" whatever provider (efa, tcp, cxi) sits
below. So the verdict here rests on the channel lines (`... via NET/<name>/<dev>`), which
NCCL prints only when a connection is set up over that network, and on the provider the
plugin says it selected, per process and per rank; ranks that disagree make `mixed`.

The wording covered spans NCCL 2.3 (`Ring 00 : 0[0] -> 1[1] via ...`, `Using internal
Network IB`) to 2.29 (`Assigned NET plugin ... to comm`, `nRanks ... nNodes`) and
aws-ofi-nccl 1.x (`Using aws-ofi-nccl 1.3.0aws`, `Initializing aws-ofi-nccl 1.17.2`,
`Selected Provider is efa (found 4 nics)`, `Selected provider is efa, fabric is efa-direct`).

Pure: lines or byte chunks in, an `NcclReport` out. Reading files is `collect.py`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

VERDICTS: tuple[str, ...] = ("efa", "socket", "ib", "libfabric-other", "single-node", "mixed", "unknown")
EXPECTABLE: tuple[str, ...] = ("efa", "socket", "ib", "single-node")

# Relative speed of what carried inter-node traffic; a fallback lands on a lower rank.
_SPEED = {"efa": 3, "ib": 3, "net plugin": 3, "libfabric-other": 2, "socket": 1}

MAX_EVIDENCE_PER_KIND = 4
# PyTorch prints the NCCL result code, "Last error:" and the cause on the lines after "NCCL error".
ERROR_CONTEXT_LINES = 3
MAX_ERRORS = 200

# ---------------------------------------------------------------------------------------
# Candidate search over raw bytes: one literal-prefixed pattern per pass, so the regex
# engine skips to each "NCCL" in C and Python only sees the lines worth parsing.
_CAND_NCCL = re.compile(
    rb"NCCL (?:WARN|ABORT|version|error|communicator|INFO (?:\[Rank \d+\] )?(?:Channel|Ring|Bootstrap|Failed to initialize NET"
    rb"|Using (?:network|internal Net)|Initialized NET|Assigned NET|NET/(?:Plugin|IB|Socket|OFI (?:Selected|Using aws|Initializing aws))"
    rb"|P2P plugin|Plugin Path|comm 0x|ncclComm|rank \d+ nranks|NCCL version|NCCL_[A-Z0-9_]+ set |NVLS|Connected NVLS))"
    rb"|NCCL\.cpp:\d+\][^\n]*?(?:[Tt]imeout|[Ee]rror|[Ff]ail)"
)
# Rarer anchors, located with bytes.find (faster than the regex engine's prefix scan for
# a literal that seldom occurs) and confirmed with a match at that spot.
# (A lower-case "nccl" pass for bare `ncclSystemError:` lines cost as much as the main scan;
# PyTorch prints those under an "NCCL error" line, which the main pass already catches.)
_CAND_OTHER = ((b"libfabric:", re.compile(rb"libfabric:[^\n]*?<warn>")),)

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


@dataclass
class NcclReport:
    """The answer for a whole log: verdict, fallback, and the lines it rests on."""

    verdict: str
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
    selected: list[str] = field(default_factory=list)
    transports: set[str] = field(default_factory=set)
    nets: set[str] = field(default_factory=set)
    gdr: bool = False
    nnodes: int | None = None
    errors: int = 0


def net_class(name: str, provider: str | None) -> str:
    """Map NCCL's network name (and the OFI provider below it) to a verdict word."""
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
        self._last_text = ""
        self._heads: dict[str, object] = {}
        self._chan_seen: set[tuple[str, str]] = set()
        self._chan_bytes_seen: set[bytes] = set()
        self.context_wanted = 0
        self.provider_sources: set[str] = set()
        self._line_of: Callable[[], int] | None = None

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
                head = text[:i]
                proc = self._heads.get(head, _MISS)
                if proc is _MISS:
                    if len(self._heads) > 50_000:
                        self._heads.clear()
                    proc = self._heads[head] = self._identify_slow(head + " NCCL INFO ")[0]
                return proc, level, text[i + 11 :]
        return self._identify_slow(text)

    def _identify_slow(self, text: str) -> tuple[_Proc | None, str | None, str]:
        m = _PREFIX.search(text)
        ray = _RAY.search(text) if "pid=" in text else None
        if m:
            host, pid, dev = m.group(1), int(m.group(2)), int(m.group(4))
            key = f"{host}:{pid}:{dev}"
            proc = self.procs.get(key)
            if proc is None:
                proc = self.procs[key] = _Proc(key=key, node=host, pid=pid, device=dev)
            if ray and ray.group(3):
                proc.ip = ray.group(3)
            return proc, m.group(5), m.group(6)
        b = _BARE.search(text)
        if ray:
            node = ray.group(3) or "ray-driver-node"
            key = f"{node}:{ray.group(2)}"
            proc = self.procs.get(key)
            if proc is None:
                proc = self.procs[key] = _Proc(key=key, node=node, ip=ray.group(3), pid=int(ray.group(2)))
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
                if proc is not None:
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
            if msg.startswith("Initialized NET plugin"):
                self._note("plugin", text, line, source)
            return
        if c == "F":
            if msg.startswith("Failed to initialize NET plugin"):
                self._plugin_init_failed(msg[31:].strip(), text, line, source)
            return
        if c == "N":
            if msg.startswith("NET/OFI"):
                self._ofi(tgt, msg, text, line, source)
            elif msg.startswith("NET/Plugin"):
                self._plugin(tgt, msg, text, line, source)
            elif msg.startswith("NET/IB"):
                self._note("ib", text, line, source)
                if "No device found" in msg and self.ib_nodev is None:
                    self.ib_nodev = Evidence("ib", source, self._ln(line), text.strip())
            elif msg.startswith("NET/Socket"):
                self._note("socket", text, line, source)
            elif msg.startswith("NCCL version"):
                v = _VERSION.match(msg)
                if v:
                    tgt.version = v.group(1) + v.group(2)
                    self._note("version", text, line, source)
            elif msg.startswith("NCCL_"):
                self._env(msg)
            elif msg.startswith("NVLS"):
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
                self._comm(proc, m, text, line, source)

    def _plugin_init_failed(self, name: str, text: str, line: int, source: str) -> None:
        """NCCL >= 2.2x tries its network plugins in turn and says which could not start."""
        self._note("plugin", text, line, source)
        low = name.lower()
        if low.startswith("ib"):
            # Probing IB on an Ethernet host is normal; it is a failure only if IB was wanted.
            if self.ib_nodev is None:
                self.ib_nodev = Evidence("ib", source, self._ln(line), text.strip())
        elif "libfabric" in low or low.startswith("ofi"):
            self.ofi_failed = True
            self._fail("ofi", text, line, source)
        elif low and not low.startswith("socket"):
            self.plugin_failed = True
            self._fail("plugin", text, line, source)

    def _select(self, tgt: _Proc, name: str, text: str, line: int, source: str) -> None:
        if name and name not in tgt.selected:
            tgt.selected.append(name)
        self._note("network", text, line, source)

    def _comm(self, proc: _Proc | None, m: re.Match[str], text: str, line: int, source: str) -> None:
        rank, nranks = int(m.group(1)), int(m.group(2))
        p = proc or self._rank_proc(rank)
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
        src, dst, direction = int(ch.group(1)), int(ch.group(2)), ch.group(3)
        via = ch.group(4)
        for cut in (" comm 0x", " nRanks"):
            k = via.find(cut)
            if k >= 0:
                via = via[:k]
        via = via.strip()
        p = proc or self._rank_proc(dst if direction == "receive" else src)
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
        if m:
            self.provider_sources.add(source)
            tgt.provider = m.group(1)
            tgt.fabric = m.group(2)
            if not tgt.plugin:
                tgt.plugin = "aws-ofi-nccl"
            self._note("provider", text, line, source)
            return
        m = _OFI_VERSION.search(msg)
        if m:
            tgt.plugin, tgt.plugin_version = "aws-ofi-nccl", m.group(1)
            self._note("plugin", text, line, source)
            return
        self._note("ofi", text, line, source)

    def _plugin(self, tgt: _Proc, msg: str, text: str, line: int, source: str) -> None:
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
        if "net/ofi" in low or "ofi" in low.split(" ", 1)[0] or "aws-ofi-nccl" in low:
            self.ofi_failed = True
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
        if lf:
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
    def report(self) -> NcclReport:
        if self.ib_nodev is not None and self.ib_expected and not self.ib_failed:
            self.ib_failed = True
            self._fail("ib", self.ib_nodev.text, self.ib_nodev.line, self.ib_nodev.source)
        procs = list(self.procs.values())
        g = self.glob
        versions = _uniq([p.version for p in procs] + [g.version])
        providers = _uniq([p.provider for p in procs] + [g.provider])
        hinted = False
        if not providers and self.provider_hint is not None:
            providers, hinted = ["efa"], True
        fabrics = _uniq([p.fabric for p in procs] + [g.fabric])
        plugins = _uniq([p.plugin for p in procs] + [g.plugin])
        plugin_versions = _uniq([p.plugin_version for p in procs] + [g.plugin_version])
        selected = _uniq([n for p in procs + [g] for n in p.selected])
        one_provider = providers[0] if len(providers) == 1 else None

        hosts = {p.node for p in procs if p.node and not p.key.startswith("rank ")}
        nnodes_decl = max([p.nnodes for p in procs + [g] if p.nnodes] or [0]) or None
        nodes = max(nnodes_decl or 0, len(hosts)) or None
        multi_node = bool(nodes and nodes >= 2)
        any_channel = any(p.transports for p in procs + [g])
        ranked = [p for p in procs + [g] if p.nranks]
        one_rank = bool(ranked) and all(p.nranks == 1 for p in ranked)

        reasons: list[str] = []
        classes: dict[str, list[str]] = {}
        rank_rows: list[RankInfo] = []
        for p in sorted(procs, key=_proc_order):
            prov = p.provider or one_provider
            inter: str | None = None
            if p.nets:
                cs = sorted({net_class(n, prov) for n in p.nets})
                inter = cs[0] if len(cs) == 1 else "mixed"
            elif multi_node and (nnodes_decl or 0) >= 2 and p.selected:
                cs = sorted({net_class(n, prov) for n in p.selected})
                inter = (cs[0] if len(cs) == 1 else "mixed") + "*"
            if inter:
                classes.setdefault(inter.rstrip("*"), []).append(p.key)
            rank_rows.append(
                RankInfo(
                    key=p.key, rank=p.rank, nranks=p.nranks or None, node=p.node, ip=p.ip, pid=p.pid,
                    device=p.device, nccl_version=p.version or g.version, plugin=p.plugin or (plugins[0] if len(plugins) == 1 else None),
                    provider=prov, fabric=p.fabric, network=(p.selected[-1] if p.selected else (selected[0] if len(selected) == 1 else None)),
                    transports=sorted(p.transports), inter_node=inter, gdr=(p.gdr if p.nets else None), errors=p.errors,
                )
            )
        if g.nets:
            cs = {net_class(n, one_provider) for n in g.nets}
            for c in cs:
                classes.setdefault(c, []).append("*")
        if not classes and (nnodes_decl or 0) >= 2 and selected:
            for n in selected:
                classes.setdefault(net_class(n, one_provider), []).append("selected")

        verdict: str
        if len(classes) > 1:
            verdict = "mixed"
            reasons.append("ranks disagree: " + "; ".join(f"{c}: {', '.join(k[:6])}{' …' if len(k) > 6 else ''}" for c, k in sorted(classes.items())))
        elif len(classes) == 1:
            c = next(iter(classes))
            if c == "libfabric?":
                verdict = "unknown"
                reasons.append("traffic crossed the Libfabric network but the log never says which provider the OFI plugin selected (Libfabric is not proof of EFA)")
            elif c in ("unknown", "mixed"):
                verdict = c if c == "mixed" else "unknown"
                reasons.append("inter-node traffic over an unrecognised network: " + ", ".join(sorted({n for p in procs + [g] for n in p.nets})))
            else:
                verdict = c
                how = "channel lines" if any(p.nets for p in procs + [g]) else f"the selected network on a {nnodes_decl}-node communicator (no channel lines logged)"
                reasons.append(f"inter-node traffic over {', '.join(sorted({n for p in procs + [g] for n in p.nets}) or selected)} per {how}")
                if c in ("efa", "libfabric-other"):
                    src = f" (from libfabric's efa endpoint log, line {self.provider_hint.line})" if hinted and self.provider_hint else ""
                    reasons.append(f"OFI provider: {', '.join(providers)}{src}")
        elif len(hosts) <= 1 and (nnodes_decl or 1) <= 1 and (any_channel or nnodes_decl == 1 or one_rank):
            verdict = "single-node"
            if any_channel:
                reasons.append("no channel crossed a network: all peers connected over P2P/SHM/NVLS")
            else:
                reasons.append("communicators report nNodes 1" if nnodes_decl == 1 else "every communicator has a single rank")
            if selected:
                reasons.append(f"NCCL selected {', '.join(selected)}, but nothing crossed it")
        elif any_channel and len(hosts) > 1:
            verdict = "unknown"
            reasons.append(f"{len(hosts)} hosts, but the log shows only intra-node channels (P2P/SHM): the inter-node connections are not in it")
        else:
            verdict = "unknown"
            reasons.append("no channel lines and no multi-node communicator in the log: not enough evidence" if (selected or versions or procs or self.errors) else "no NCCL output found (is NCCL_DEBUG=INFO set?)")

        attempted = self._attempted()
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

        gdr: bool | None = None
        net_procs = [p for p in procs + [g] if p.nets]
        if net_procs:
            gdr = all(p.gdr for p in net_procs)

        report = NcclReport(
            verdict=verdict, fallback=fallback, fallback_from=attempted if fallback else None, gdr=gdr,
            nccl_version=", ".join(versions) or None,
            plugin=", ".join(plugins) or None,
            plugin_version=", ".join(plugin_versions) or None,
            provider=", ".join(providers) or None,
            fabric=", ".join(fabrics) or None,
            network=", ".join(selected) or None,
            nodes=nodes, ranks=rank_rows, errors=self.errors, evidence=sorted(self.evidence, key=lambda e: (e.source, e.line)),
            failures=self.failures, reasons=reasons, causes=[], env=dict(self.env), sources=list(self.sources),
            lines=self.lines, candidates=self.candidates, folded_repeats=self.repeated,
        )
        report.causes = likely_causes(report)
        return report

    def _attempted(self) -> str | None:
        """The faster transport that the log shows failing (or present but unused), if any."""
        if self.ofi_failed or self.efa_failed:
            return "efa"
        if self.env.get("NCCL_NET", "").strip().lower().startswith("socket"):
            return None  # sockets on purpose
        plugins = {p.plugin for p in list(self.procs.values()) + [self.glob] if p.plugin}
        ofi = any(x == "aws-ofi-nccl" or "libfabric" in x.lower() for x in plugins)
        if (ofi or any(p.provider for p in list(self.procs.values()) + [self.glob])) and self._landed_socket():
            return "efa"
        if self.plugin_failed:
            texts = " ".join(e.text.lower() for e in self.failures)
            ofi = any(p.plugin == "aws-ofi-nccl" for p in self.procs.values()) or "ofi" in texts or "libfabric" in texts
            return "efa" if ofi else "net plugin"
        if self.ib_failed or (self.ib_nodev is not None and self.ib_expected):
            return "ib"
        if any(p.startswith("HPC-X") for p in plugins) and self._landed_socket():
            return "ib"
        return None

    def _landed_socket(self) -> bool:
        procs = list(self.procs.values()) + [self.glob]
        return any(n.lower().startswith("socket") for p in procs for n in p.nets) or (
            not any(p.nets for p in procs) and any(n.lower().startswith("socket") for p in procs for n in p.selected))


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

    def __init__(self, parser: NcclParser, source: str = "-") -> None:
        self.parser = parser
        self.source = source
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
        seen, find = parser._chan_bytes_seen, data.find
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
                # Channel lines are most of NCCL's output and repeat per channel number: a line
                # equal to one already parsed except for that number adds nothing.
                i = find(b" NCCL INFO Channel ", b, e)
                if i >= 0:
                    j = find(b" : ", i, e)
                    if j >= 0:
                        key = data[b:i] + data[j:e]
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
        total = newlines(start, end)
        self._line += total
        parser.lines += total


# Below this many bytes, bytes.count is cheaper than importing numpy (~0.15 s); above it,
# numpy's vectorised compare counts newlines ~7x faster.
NUMPY_MIN = 4 << 20


def _numpy() -> Any:
    import numpy

    return numpy


def analyze_chunks(chunks: Iterable[bytes], source: str = "-", parser: NcclParser | None = None) -> NcclReport:
    """Report for one stream of raw bytes; pass `parser` to combine several streams."""
    p = parser or NcclParser()
    sc = ChunkScanner(p, source)
    for c in chunks:
        sc.feed(c)
    sc.close()
    return p.report()


def analyze_lines(lines: Iterable[str | bytes], source: str = "-") -> NcclReport:
    """Report for an iterable of text lines (each parsed only if it can carry evidence)."""
    p = NcclParser()
    p.sources.append(source)
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
