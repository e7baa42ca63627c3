"""The wording NCCL and aws-ofi-nccl print, what each line tells, and where that wording comes from.

Three tables, all data:
- `RULES`: every kind of evidence a conclusion may rest on, with its wording, what it tells
  and its source (file, releases). A report's evidence kinds are keys of it.
- `PREFIXES`: which handler of the parser reads an INFO message, by how the message starts
  (after the `host:pid:tid [dev] NCCL INFO ` prefix). A new NCCL wording is one row here, one
  handler, and its rule.
- the patterns: the candidate search over raw bytes (`CAND_*`, used by the scanner) and the
  line-level patterns the handlers apply to candidate lines.
"""

from __future__ import annotations

import re
from typing import NamedTuple


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
    "efa-address": Rule(
        "fi_addr_efa://[<gid>]:<qpn>:<qkey>, in libfabric's efa errors ('... My EFA addr: fi_addr_efa://... Peer EFA addr: ...'), "
        "which aws-ofi-nccl's completion-error warnings quote",
        "an endpoint address in the EFA address format: the provider is efa",
        "libfabric src/common.c ofi_straddr (FI_ADDR_EFA as 'fi_addr_efa://[%s]:%u:%u'), prov/efa/src/rdm/efa_rdm_util.c "
        "efa_rdm_write_error_msg ('My EFA addr: %s'); aws-ofi-nccl src/nccl_ofi_rdma.cpp, src/platform-aws.cpp print it through "
        "fi_cq_strerror (v1.21.1)"),
    "efa-device": Rule(
        "NET/<net> : GPU Direct RDMA Enabled|Disabled for HCA <n> 'efa_<k>'; NET/OFI GUID of efa_<k>: <guid>",
        "the plugin's network device is an EFA device, which the kernel's efa driver names efa_<k>: the provider is efa "
        "(devices renamed by udev, such as rdmap16s27, are not counted: that naming is not EFA's alone)",
        "Linux drivers/infiniband/hw/efa/efa_main.c ib_register_device(..., \"efa_%d\"); NCCL src/graph/topo.cc "
        "'NET/%s : GPU Direct RDMA %s for HCA %d '%s'' (2.13-2.29) with the name aws-ofi-nccl gives (src/nccl_ofi_net.cpp: the "
        "NIC's device_attr name, else the domain name); aws-ofi-nccl src/platform-aws.cpp 'GUID of %s' (v1.21)"),
    "libfabric-gdr": Rule(
        "Channel ... via NET/<Libfabric|AWS Libfabric>/<dev>/GDRDMA, with no line that names or proves the provider",
        "the OFI plugin carried the traffic straight from GPU memory: verdict libfabric, provider unproven. aws-ofi-nccl "
        "offers GPU pointers whenever its provider supports FI_HMEM, which efa does and others can: EFA only when a provider, "
        "efa-address or efa-device line proves it",
        "NCCL src/transport/net.cc ('/GDRDMA' when the connection uses GPU Direct RDMA, 2.4-2.29); aws-ofi-nccl "
        "src/nccl_ofi_interface_nvidia.cpp (ptrSupport |= NCCL_PTR_CUDA when hmem_support), src/nccl_ofi_net.cpp "
        "(hmem_support from support_gdr), v1.21.1"),
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
    "env": Rule(
        "NCCL_<X> set by environment to <V>.; NCCL_IB_HCA set to <V>",
        "the settings in force: NCCL_NET pins the network (no fallback, and a Socket pin is on purpose), NCCL_IB_HCA or "
        "NCCL_IB_DISABLE=0 say IB was wanted",
        "NCCL src/misc/param.cc ncclLoadParam '%s set by environment to %lld.' (2.4-2.29, include/param.h in 2.4); string "
        "settings where they are read, e.g. src/transport/net_ib/init.cc 'NCCL_IB_HCA set to %s'"),
    "ofi": Rule("NET/OFI ...", "other OFI plugin lines kept as context", "aws-ofi-nccl"),
    "socket": Rule("NET/Socket ...", "other Socket transport lines kept as context", "NCCL src/transport/net_socket.cc"),
}


class Prefix(NamedTuple):
    """An INFO message that starts with `prefix` is read by the parser's handler `handler`, as evidence of `rule`."""

    prefix: str
    handler: str
    rule: str


# Tried in order among the rows that share a first character; the first that matches reads the line.
PREFIXES: tuple[Prefix, ...] = (
    Prefix("Channel", "channel", "net-channel"),  # "Channel 00/0 : 0[0] -> 8[0] [send] via NET/…", or P2P/SHM (rule channel)
    Prefix("Connected NVLS", "nvls", "channel"),
    Prefix("Ring", "ring", "net-channel"),  # NCCL 2.3-2.4: "Ring 00 : 0 -> 8 via NET/…"
    Prefix("Using network ", "network", "network"),
    Prefix("Using internal Network ", "network", "network"),  # NCCL 2.3
    Prefix("Assigned NET plugin ", "assigned", "network"),
    Prefix("Initialized NET plugin", "net_init", "net-init"),
    Prefix("Init timings", "comm", "comm"),  # "Init timings - ncclCommInitRank: rank 0 nranks 16 …" (2.23+)
    Prefix("Failed to initialize NET plugin", "net_init_failed", "net-init"),
    Prefix("Bootstrap", "bootstrap", "bootstrap"),  # "Bootstrap : Using eth0:10.0.0.1<0>" ("Bootstrap: Using" since 2.24)
    Prefix("NET/OFI", "ofi", "provider"),
    Prefix("NET/Plugin", "plugin", "plugin"),
    Prefix("NET/IB", "net_ib", "ib-init"),
    Prefix("NET/Socket", "net_socket", "socket-init"),
    Prefix("NET/", "net_device", "efa-device"),  # "NET/Libfabric : GPU Direct RDMA Enabled for HCA 0 'efa_0'" (2.13+)
    Prefix("NCCL version", "version", "version"),
    Prefix("NCCL_", "env", "env"),
    Prefix("NVLS comm ", "nvls", "channel"),  # NVLS set up (transport/nvls.cc); "NVLS multicast support is …" is not
    Prefix("P2P plugin", "plugin", "plugin"),  # HPC-X nccl-rdma-sharp-plugins
    Prefix("Plugin Path", "plugin", "plugin"),
    Prefix("comm ", "comm", "comm"),  # "comm 0x.. rank R nRanks N nNodes K …", "… - Init COMPLETE"
    Prefix("nccl", "comm", "comm"),  # "ncclCommInitRank comm 0x.. rank R nranks N … - Init START"
    Prefix("rank ", "comm", "comm"),  # NCCL 2.3: "rank R nranks N"
)


# ---------------------------------------------------------------------------------------
# Candidate search over raw bytes: one literal-prefixed pattern per pass, so the regex
# engine skips to each "NCCL" in C and Python only sees the lines worth parsing.
CAND_NCCL = re.compile(
    rb"NCCL (?:WARN|ABORT|version|error|communicator|INFO (?:\[Rank \d+\] )?(?:Channel|Ring|Bootstrap|Failed to initialize NET"
    rb"|Using (?:network|internal Net)|Initialized NET|Assigned NET|NET/(?:Plugin|IB|Socket"
    rb"|OFI (?:Selected|Using aws|Initializing aws|Setting provider_filter|Forcing AWS|GUID of efa_)|(?:AWS )?Libfabric : GPU Direct)"
    rb"|P2P plugin|Plugin Path|comm 0x|ncclComm|rank \d+ nranks|Init timings|NCCL version|NCCL_[A-Z0-9_]+ set |NVLS comm|Connected (?:NVLS|all)))"
    rb"|NCCL\.cpp:\d+\][^\n]*?(?:[Tt]imeout|[Ee]rror|[Ff]ail)"
)
# Rarer anchors, located with bytes.find (faster than the regex engine's prefix scan for
# a literal that seldom occurs) and confirmed with a match at that spot.
# (A lower-case "nccl" pass for bare `ncclSystemError:` lines cost as much as the main scan;
# PyTorch prints those under an "NCCL error" line, which the main pass already catches.)
CAND_OTHER = ((b"libfabric:", re.compile(rb"libfabric:[^\n]*?<warn>")),)
# (Ray's "[repeated Nx across cluster]" folds are counted on the lines read as evidence: a
# separate pass for the marker costs a quarter of the whole scan.)

# ---------------------------------------------------------------------------------------
# Line-level patterns (str), applied only to candidate lines.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RAY = re.compile(r"\((\w+) pid=(\d+)(?:, ip=([0-9A-Fa-f.:]+))?\)")
REPEATED = re.compile(r"\s*\[repeated (\d+)x across cluster\]")
PREFIX_HEAD = re.compile(r"[^\s:|\[\]()]+:\d+:\d+ \[\d+\] ")
# WARN lines put the source location between the prefix and "NCCL": `proxy.cc:1485`,
# `nccl_net_ofi_init:155`, or a whole C++ signature in aws-ofi-nccl >= 1.14.
PREFIX = re.compile(r"([^\s:|\[\]()]+):(\d+):(\d+) \[(\d+)\] (?:.*? )?NCCL (INFO|WARN|TRACE|ABORT) ?(.*)")
BARE = re.compile(r"NCCL (INFO|WARN|TRACE|ABORT) ?(.*)")
VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(\S*)")
OFI_VERSION = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl (\S+)")
PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^\s,(]+)(?:, fabric is ([^\s,(]+))?")
LOADED_PLUGIN = re.compile(r"NET/Plugin ?: Loaded net plugin (.+?)\s*\((v\d+)\)")
P2P_PLUGIN = re.compile(r"^P2P plugin (?:v\d+ )?(\S+)")
SO_PROBLEM = re.compile(r"([\w.+\-/]+\.so[\w.]*): (cannot open shared object file|version `[^']*' not found|undefined symbol)")
REQUESTED_PLUGIN_MISSING = re.compile(r"Could not find: (\S+) (libnccl-net-\S+\.so)|Plugin load \((libnccl-net-\S+\.so)\) returned")
COMM = re.compile(r"\brank (\d+) n[Rr]anks (\d+)(?: nNodes (\d+))?")
COMM_PTR = re.compile(r"\bcomm (0x[0-9a-fA-F]+)")
COMM_ID = re.compile(r"\bcommId (0x[0-9a-fA-F]+)")
BUS_ID = re.compile(r"\bbusId ([0-9a-fA-Fx]+)")
LOCAL_RANKS = re.compile(r"\blocalRanks (\d+)")
CHANNEL = re.compile(
    r"(?:Channel|Ring) \d+(?:/\d+)? : (\d+)(?:\[[0-9a-fA-Fx]+\])? -> (\d+)(?:\[[0-9a-fA-Fx]+\])?"
    r"(?: \[(send|receive)\])? via (.+)"
)
# NET/<name>/<dev>[(proxy rank)][/GDRDMA][/Shared][/flush=…]
NET_TRANSPORT = re.compile(r"^NET/(.+?)/(\d+)(?:\(\d+\))?((?:/[^/\s]+)*)\s*$")
ENV = re.compile(r"^(NCCL_[A-Z0-9_]+) set (?:by environment )?to (.*?)\.?\s*$")
LIBFABRIC = re.compile(r"libfabric:\d+(?::\d+)?:+([\w-]*):(\w*):([^:]*):[^<]*<warn>\s*(.*)")
# Subsystems where only an opened endpoint/domain of that provider logs.
LIBFABRIC_EP_SUBSYS = ("ep_ctrl", "ep_data", "cq", "av", "domain", "mr")
APP_ERROR = re.compile(
    r"(nccl(?:(?:System|Internal|Remote|UnhandledCuda)Error|Invalid(?:Usage|Argument))|NCCL error|"
    r"NCCL communicator|Watchdog caught collective operation timeout|DistBackendError)"
)
# `<ifname>:<address><port>` as NCCL's socketToString prints it (IPv4, or IPv6 with %scope).
ADDR = re.compile(r"([\w.\-]+):(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F]*:[0-9a-fA-F:.]*(?:%[\w.\-]+)?)<\d+>")
# An EFA device in the plugin's lines: `for HCA 0 'efa_0'`, `GUID of efa_3:` (rule efa-device).
EFA_DEVICE = re.compile(r"(?:for HCA \d+ '|GUID of )(efa_\d+)\b")
EFA_ADDRESS = "fi_addr_efa://"  # rule efa-address
# A device in the IB transport's list: ` [0]mlx5_0:1/IB`, ` [3]mlx5_3:1/RoCE`, `/IB/SHARP`.
IB_DEV = re.compile(r"\[\d+\][\w.\-]+:\d+/(\w+)")


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
    if is_libfabric(low):
        if provider is None:
            return "libfabric?"
        return "efa" if provider.split(";")[0] in ("efa", "efa-direct") else "libfabric-other"
    return "unknown"


def is_libfabric(name: str) -> bool:
    """aws-ofi-nccl's network: "Libfabric", "AWS Libfabric" (older), "OFI"/"AWS OFI" (some builds)."""
    low = name.strip().lower()
    return "libfabric" in low or low.startswith("ofi") or low == "aws ofi"
