"""Lines to facts: who printed each NCCL line, what it says, and the frozen `NcclFacts` at the end.

Each line is split into its process (the `host:pid:tid [dev]` prefix, a Ray worker's
`(RayTrainWorker pid=…, ip=…)`, a bare rank number, or the machine the caller named), its
level and its message; an INFO message goes to the handler that `rules.PREFIXES` names for
how it starts. Handlers only record what the line says, per process; every conclusion is
the verdict's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from raydlc.nccl import rules as R
from raydlc.nccl.facts import Evidence, NcclFacts, Process

if TYPE_CHECKING:
    from raydlc.nccl.report import NcclReport

MAX_EVIDENCE_PER_KIND = 4
# PyTorch prints the NCCL result code, "Last error:" and the cause on the lines after "NCCL error".
ERROR_CONTEXT_LINES = 3
MAX_ERRORS = 200

_MISS = object()
Handler = Callable[["_Proc | None", "_Proc", str, str, str, int, str], None]


@dataclass
class _Proc:
    """A process's facts while they are gathered; `freeze()` gives its `Process`."""

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
    inits: list[str] = field(default_factory=list)
    choices: list[tuple[str, str]] = field(default_factory=list)
    roce: bool = False
    ib_absent: bool = False
    boot_socket: bool = False
    transports: set[str] = field(default_factory=set)
    nets: set[str] = field(default_factory=set)
    gdr: bool = False
    nnodes: int | None = None
    errors: int = 0
    ofi_failed: bool = False
    addrs: dict[str, list[frozenset[str]]] = field(default_factory=dict)
    comm_rank: dict[str, int] = field(default_factory=dict)  # comm pointer or commId -> rank
    comm_ids: dict[str, str] = field(default_factory=dict)  # comm pointer -> commId
    joined: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # commId -> (rank, busId)
    local_ranks: dict[str, int] = field(default_factory=dict)  # commId -> localRanks
    twins: dict[int, _Proc] = field(default_factory=dict)  # rank -> same prefix, another machine

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

    def freeze(self) -> Process:
        return Process(
            key=self.key, rank=self.rank, nranks=self.nranks, node=self.node, ip=self.ip, pid=self.pid, device=self.device,
            version=self.version, plugin=self.plugin, plugin_version=self.plugin_version, provider=self.provider,
            fabric=self.fabric, implied_provider=self.implied_provider, selected=tuple(self.selected), inits=tuple(self.inits),
            choices=tuple(self.choices), roce=self.roce, ib_absent=self.ib_absent, boot_socket=self.boot_socket,
            transports=frozenset(self.transports), nets=frozenset(self.nets), gdr=self.gdr, nnodes=self.nnodes,
            errors=self.errors, ofi_failed=self.ofi_failed,
            addrs=MappingProxyType({k: tuple(v) for k, v in self.addrs.items()}),
            joined=MappingProxyType(dict(self.joined)), local_ranks=MappingProxyType(dict(self.local_ranks)),
            twins=tuple(self.twins),
        )


class NcclParser:
    """Feed lines in order (with their line numbers); `facts()` freezes what they showed, `report()` judges it.

    It is the `scan.LineSink` that `ChunkScanner` feeds, and `analyze_lines` feeds it directly.
    """

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
        self._info_seen: set[str] = set()
        self.seen: set[bytes] = set()  # raw lines a scanner already handed over (scan.LineSink)
        self.context_wanted = 0
        self.provider_sources: set[str] = set()
        self._line_of: Callable[[], int] | None = None
        self.node_hint: str | None = None  # the machine the current source came from, if the caller knows
        self._handlers = _handler_table(self)

    # -- scan.LineSink ------------------------------------------------------------------
    def begin(self, source: str) -> None:
        self._last_text = ""
        if source not in self.sources:
            self.sources.append(source)

    def at(self, node: str | None, line_of: Callable[[], int] | None) -> None:
        self.node_hint, self._line_of = node, line_of

    def knows_provider(self, source: str) -> bool:
        return source in self.provider_sources

    def count_lines(self, n: int) -> None:
        self.lines += n

    # -- intake -----------------------------------------------------------------------
    def feed_line(self, text: str, line: int = 0, source: str = "-") -> None:
        """Parse one line of any supported format; lines without evidence are ignored."""
        self.candidates += 1
        if "\x1b" in text:
            text = R.ANSI.sub("", text)
        if " | " in text:
            text = _last_segment(text)
        text = text.rstrip("\r\n")
        if text == self._last_text:  # doubled exports: same line twice in a row
            return
        self._last_text = text
        rep = R.REPEATED.search(text) if "repeated" in text else None
        if rep:
            self.repeated += int(rep.group(1))
            text = text[: rep.start()] + text[rep.end():]
        if text.count(" NCCL ") > 1:
            heads = [m.start() for m in R.PREFIX_HEAD.finditer(text)]
            if len(heads) > 1:
                bounds = [0, *heads[1:], len(text)]
                for a, b in zip(bounds, bounds[1:]):
                    self._one(text[a:b].strip(), line, source)
                return
        self._one(text, line, source)

    def feed_context(self, text: str, line: int = -1, source: str = "-") -> None:
        """A line after a PyTorch "NCCL error": `ncclSystemError: …`, `Last error:` and its cause."""
        self.context_wanted -= 1
        text = text.strip()
        if text and not text.startswith(("File ", "Traceback", "^")):
            self._error(None, text, line, source)

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
                return proc, level, text[i + 11 :]  # type: ignore[return-value]
        return self._identify_slow(text)

    def _identify_slow(self, text: str) -> tuple[_Proc | None, str | None, str]:
        m = R.PREFIX.search(text)
        ray = R.RAY.search(text) if "pid=" in text else None
        hint = self.node_hint
        if m:
            host, pid, dev = m.group(1), int(m.group(2)), int(m.group(4))
            proc = self._proc(f"{host}:{pid}:{dev}" + (f"@{hint}" if hint else ""), node=host, pid=pid, device=dev)
            if ray and ray.group(3):
                proc.ip = ray.group(3)
                proc.add_addrs("ray", [ray.group(3)])
            return proc, m.group(5), m.group(6)
        b = R.BARE.search(text)
        level, msg = (b.group(1), b.group(2)) if b else (None, text)
        if ray:
            node = ray.group(3) or "ray-driver-node"
            proc = self._proc(f"{node}:{ray.group(2)}" + (f"@{hint}" if hint else ""), node=node, ip=ray.group(3), pid=int(ray.group(2)))
            return proc, level, msg
        if hint:  # no prefix, but the caller said which machine this file is from
            return self._proc(hint, node=hint), level, msg
        return None, level, msg

    def _proc(self, key: str, node: str, pid: int | None = None, device: int | None = None, ip: str | None = None) -> _Proc:
        """The process with this key, made on first sight with the addresses its key tells (Ray's ip, the caller's node)."""
        proc = self.procs.get(key)
        if proc is None:
            proc = self.procs[key] = _Proc(key=key, node=node, ip=ip, pid=pid, device=device)
            if ip:
                proc.add_addrs("ray", [ip])
            if self.node_hint:
                proc.add_addrs("given", [self.node_hint])
        return proc

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
        if R.EFA_ADDRESS in text:  # libfabric's efa errors, and the plugin's warnings that quote them
            self._efa_proof("efa-address", text, line, source)
        if level is None:
            v = R.VERSION.search(text) if "NCCL version" in text else None
            if v:
                tgt.version = v.group(1) + v.group(2)
                self._note("version", text, line, source)
            self._other(proc, text, line, source)  # PyTorch's "NCCL error …, NCCL version x" is both
            return
        if level == "WARN" or level == "ABORT":
            self._warn(proc, msg, text, line, source)
            return
        if msg.startswith("[Rank "):
            msg = msg[msg.find("] ") + 2 :]
        for prefix, handle in self._handlers.get(msg[:1], ()):
            if msg.startswith(prefix):
                handle(proc, tgt, msg, msg[len(prefix):], text, line, source)
                return

    # -- INFO handlers (rules.PREFIXES names them) ------------------------------------------
    def on_channel(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
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
        self.on_ring(proc, tgt, msg, rest, text, line, source)

    def on_ring(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """Rules net-channel (traffic over a network) and channel (P2P/SHM/NVLS inside a host)."""
        ch = R.CHANNEL.match(msg)
        if not ch:
            return
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
        net = R.NET_TRANSPORT.match(via) if via.startswith("NET/") else None
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

    def on_net_device(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """NCCL's `NET/<net> : GPU Direct RDMA Enabled for HCA 0 'efa_0'`: the plugin's device, an EFA one or not (rule efa-device)."""
        if R.EFA_DEVICE.search(msg):
            self._efa_proof("efa-device", text, line, source)

    def _efa_proof(self, kind: str, text: str, line: int, source: str) -> None:
        """A line that proves the efa provider without naming it (rules efa-address, efa-device); the first one is kept."""
        if self.provider_hint is None:
            self.provider_hint = Evidence(kind, source, self._ln(line), text.strip())
        self._note(kind, text, line, source)

    def on_nvls(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        tgt.transports.add("NVLS")
        self._note("channel", text, line, source)

    def on_network(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        self._select(tgt, rest.strip(), text, line, source)

    def on_assigned(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        self._select(tgt, rest.split(" to comm", 1)[0].strip(), text, line, source)

    def _select(self, tgt: _Proc, name: str, text: str, line: int, source: str) -> None:
        if name and name not in tgt.selected:
            tgt.selected.append(name)
        self._note("network", text, line, source)

    def on_net_init(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """NCCL >= 2.27 (src/plugin/net.cc): the plugin that initialises first is assigned to the comm."""
        name = rest.strip()
        if name and name not in tgt.inits:
            tgt.inits.append(name)
        self._note("net-init", text, line, source)

    def on_net_init_failed(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """NCCL >= 2.28 tries its network plugins in turn and says which could not start (rule net-init)."""
        self._note("net-init", text, line, source)
        low = rest.strip().lower()
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

    def on_bootstrap(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        tgt.add_interfaces("bootstrap", R.ADDR.findall(msg))
        self._note("bootstrap", text, line, source)

    def on_version(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        v = R.VERSION.match(msg)
        if v:
            tgt.version = v.group(1) + v.group(2)
            self._note("version", text, line, source)

    def on_env(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        m = R.ENV.match(msg)
        if m:
            self.env[m.group(1)] = m.group(2)
            if m.group(1) == "NCCL_IB_HCA" or (m.group(1) == "NCCL_IB_DISABLE" and m.group(2).strip() == "0"):
                self.ib_expected = True

    def on_net_ib(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """NCCL's IB transport init: `NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.1.2.3<0>` (rule ib-init)."""
        if "No device found" in msg:
            self._note("ib", text, line, source)
            tgt.ib_absent = True
            if self.ib_nodev is None:
                self.ib_nodev = Evidence("ib", source, self._ln(line), text.strip())
            return
        links = R.IB_DEV.findall(msg) if "Using" in msg else []
        if not links:  # "Using [RO]; OOB …" with no device follows "No device found"
            self._note("ib", text, line, source)
            return
        if ("probe", "IB") not in tgt.choices:
            tgt.choices.append(("probe", "IB"))
        if any(x == "RoCE" for x in links):
            tgt.roce = True
        k = msg.find("OOB ")
        if k >= 0:
            tgt.add_interfaces("ib", R.ADDR.findall(msg, k))
        self._note("ib-init", text, line, source)

    def on_net_socket(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """NCCL's Socket transport: `NET/Socket : Using [0]eth0:10.0.0.1<0>` at init (rule socket-init)."""
        addrs = R.ADDR.findall(msg)
        if addrs or "sockets per thread" in msg:
            if ("probe", "Socket") not in tgt.choices:
                tgt.choices.append(("probe", "Socket"))
            tgt.add_interfaces("socket", addrs)
            self._note("socket-init", text, line, source)
        else:
            self._note("socket", text, line, source)

    def on_comm(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """A communicator line (rule comm); a rank clash under one prefix is another machine (rule pid-collision)."""
        m = R.COMM.search(msg)
        if not m:
            return
        rank, nranks = int(m.group(1)), int(m.group(2))
        p = proc or self._rank_proc(rank)
        ptr = R.COMM_PTR.search(msg) if proc is not None else None
        if ptr and (msg.endswith("Destroy COMPLETE") or msg.endswith("Abort COMPLETE")):
            p.comm_rank.pop(f"{ptr.group(1)}/{nranks}", None)  # the address may come back for another comm
            ptr = None
        if ptr:
            p = self._join(p, ptr.group(1), rank, nranks, msg, text, line, source)
        if nranks >= p.nranks:
            p.rank, p.nranks = rank, nranks
        if m.group(3):
            nn = int(m.group(3))
            if p.nnodes is None or nn > p.nnodes:
                p.nnodes = nn
        self._note("comm", text, line, source)

    def _join(self, p: _Proc, ptr: str, rank: int, nranks: int, msg: str, text: str, line: int, source: str) -> _Proc:
        """Record that `p` holds `rank` of the communicator at `ptr`; a second rank of it is another machine (a twin)."""
        cid_m = R.COMM_ID.search(msg)
        if cid_m:
            p.comm_ids[ptr] = cid_m.group(1)
        cid = p.comm_ids.get(ptr)
        ckey = cid or f"{ptr}/{nranks}"
        known = p.comm_rank.get(ckey)
        if known is None:
            p.comm_rank[ckey] = rank
        elif known != rank:
            # One process holds one rank of a communicator per GPU: this is another machine
            # whose hostname, pid and device index are the same (containers).
            twin = p.twins.get(rank)
            if twin is None:
                twin = p.twins[rank] = self.procs[f"{p.key}#{rank}"] = _Proc(
                    key=f"{p.key}#{rank}", node=p.node, ip=p.ip, pid=p.pid, device=p.device, version=p.version)
                twin.addrs = {k: list(v) for k, v in p.addrs.items()}
                self._note("pid-collision", text, line, source)
            p = twin
            p.comm_rank[ckey] = rank
        if cid:
            bus = R.BUS_ID.search(msg)
            if cid not in p.joined or bus:
                p.joined[cid] = (rank, bus.group(1).lower().removeprefix("0x").lstrip("0") if bus else None)
            lr = R.LOCAL_RANKS.search(msg)
            if lr:
                p.local_ranks[cid] = int(lr.group(1))
        return p

    def on_ofi(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """The OFI plugin's lines: its provider (rule provider), its version (plugin), its EFA-only wording (efa-wording)."""
        m = R.PROVIDER.search(msg)
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
        m = R.OFI_VERSION.search(msg)
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
        if R.EFA_DEVICE.search(msg):  # "NET/OFI GUID of efa_0: …" (rule efa-device)
            self._efa_proof("efa-device", text, line, source)
            return
        self._note("ofi", text, line, source)

    def on_plugin(self, proc: _Proc | None, tgt: _Proc, msg: str, rest: str, text: str, line: int, source: str) -> None:
        """Which net plugin is there, or why it could not be used (rules plugin, plugin-failure)."""
        if tgt.choices == [("probe", "Socket")]:
            # NCCL 2.4.0-2.4.7 initialised Socket for its bootstrap before looking for a
            # plugin (src/init.cu initNet); a Socket line before "NET/Plugin" is that one.
            tgt.choices.clear()
            tgt.boot_socket = True
        m = R.LOADED_PLUGIN.search(msg)
        if m:
            tgt.plugin, tgt.plugin_version = m.group(1), m.group(2)
            self._note("plugin", text, line, source)
            return
        m = R.P2P_PLUGIN.match(msg)
        if m:
            tgt.plugin = tgt.plugin or f"HPC-X {m.group(1)}"
            if m.group(1).lower().startswith("ib"):
                self.ib_expected = True
            self._note("plugin", text, line, source)
            return
        if msg.startswith("Plugin Path"):
            self._note("plugin", text, line, source)
            return
        self._plugin_problem(tgt, msg, text, line, source)

    def _plugin_problem(self, tgt: _Proc, msg: str, text: str, line: int, source: str) -> None:
        m = R.REQUESTED_PLUGIN_MISSING.search(msg)
        if m:  # NCCL_NET_PLUGIN named a plugin that is not there
            self.plugin_failed = True
            if "ofi" in (m.group(2) or m.group(3) or "").lower():
                self.ofi_failed = True
                tgt.ofi_failed = True
            self._fail("plugin", text, line, source)
            self._note("plugin-failure", text, line, source)
            return
        so = R.SO_PROBLEM.search(msg)
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

    # -- WARN and lines without a level ---------------------------------------------------
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

    def _other(self, proc: _Proc | None, text: str, line: int, source: str) -> None:
        lf = R.LIBFABRIC.search(text)
        if lf:  # rule libfabric
            self._note("libfabric", text, line, source)
            body = lf.group(4).lower()
            if lf.group(1) in ("efa", "efa-direct") and lf.group(2) in R.LIBFABRIC_EP_SUBSYS and self.provider_hint is None:
                self.provider_hint = Evidence("provider", source, self._ln(line), text.strip())
            if ("provider efa" in body and "empty" in body) or (lf.group(1) == "efa" and ("no efa" in body or "failed to open" in body)):
                self.efa_failed = True
                self._fail("efa", text, line, source)
            return
        if R.APP_ERROR.search(text):
            self._error(proc, text, line, source)
            self._note("error", text, line, source)
            self.context_wanted = ERROR_CONTEXT_LINES

    # -- conclusion -------------------------------------------------------------------
    def facts(self) -> NcclFacts:
        """Everything read so far, frozen; the parser can go on reading afterwards."""
        failures = list(self.failures)
        ib_failed = self.ib_failed
        if self.ib_nodev is not None and self.ib_expected and not ib_failed:
            # IB said it has no device, and the settings say IB was wanted: that is a failure.
            ib_failed = True
            if len(failures) < MAX_ERRORS:
                failures.append(self.ib_nodev)
        return NcclFacts(
            processes=tuple(p.freeze() for p in self.procs.values()), unattributed=self.glob.freeze(),
            env=MappingProxyType(dict(self.env)), errors=tuple(self.errors), failures=tuple(failures),
            evidence=tuple(self.evidence), sources=tuple(self.sources), lines=self.lines, candidates=self.candidates,
            folded_repeats=self.repeated, ib_expected=self.ib_expected, ib_failed=ib_failed, ib_nodev=self.ib_nodev,
            efa_failed=self.efa_failed, ofi_failed=self.ofi_failed, plugin_failed=self.plugin_failed,
            net_missing=self.net_missing, duplicate_gpu=self.duplicate_gpu, provider_hint=self.provider_hint,
        )

    def report(self) -> NcclReport:
        """The verdict on everything read so far (`verdict.judge(self.facts())`)."""
        from raydlc.nccl.verdict import judge

        return judge(self.facts())


def _handler_table(parser: NcclParser) -> dict[str, tuple[tuple[str, Handler], ...]]:
    """rules.PREFIXES as bound handlers, grouped by first character so a line costs one dict lookup."""
    table: dict[str, list[tuple[str, Handler]]] = {}
    for row in R.PREFIXES:
        table.setdefault(row.prefix[0], []).append((row.prefix, getattr(parser, "on_" + row.handler)))
    return {c: tuple(rows) for c, rows in table.items()}


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

