"""The verdict: which transport carried the job, how that is known, and whether NCCL fell back. Pure.

`judge(facts)` reads only `NcclFacts`, so every case can be tested on facts written by hand.
Proof levels:
- `carried`: channel lines (`... via NET/<name>/<dev>`), which NCCL prints only when it sets
  up a connection over that network, show the traffic;
- `selected`: NCCL (`Using network X`, `Assigned NET plugin X`, the IB/Socket transport's
  device list) or the OFI plugin (`Selected provider is efa`) reported choosing it, and no
  channel line is in the log;
- none (`unknown`) when neither is there.
Ranks that disagree make `mixed`, never a majority, and so do ranks of one machine that
disagree. "Libfabric" is the plugin's name for any provider: it is EFA only when a line proves
the provider (`Selected provider is efa`, an fi_addr_efa address, an efa_<k> device); with
GDRDMA channel lines and no such line it is `libfabric`, provider unproven.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from raydlc.nccl.advice import likely_causes
from raydlc.nccl.facts import NcclFacts, Process, uniq
from raydlc.nccl.machines import hosts as find_hosts
from raydlc.nccl.machines import primary_addr
from raydlc.nccl.report import HostInfo, NcclReport, RankInfo
from raydlc.nccl.rules import is_libfabric, net_class

# Relative speed of what carried inter-node traffic; a fallback lands on a lower rank.
SPEED = {"efa": 3, "ib": 3, "net plugin": 3, "libfabric": 3, "libfabric-other": 2, "socket": 1}

Chosen = dict[str, tuple[list[str], str | None]]  # process key -> (networks it chose, the rule that says so)


@dataclass(frozen=True)
class _Providers:
    """The OFI provider(s) the log names, or implies, and how to read one process's."""

    names: list[str]
    hinted: str | None  # where an implied provider came from
    one: str | None  # the provider, when the whole log names exactly one
    gdr_libfabric: bool = False  # a provider-less libfabric channel line with GDRDMA is in the log (rule libfabric-gdr)

    def of(self, p: Process) -> str | None:
        return p.provider or p.implied_provider or self.one

    def word(self, network: str, provider: str | None) -> str:
        """A network's verdict word; provider-less libfabric is `libfabric` once a GDRDMA channel showed (rule libfabric-gdr)."""
        w = net_class(network, provider)
        return "libfabric" if w == "libfabric?" and self.gdr_libfabric else w

    def words(self, p: Process, networks: Iterable[str]) -> set[str]:
        return {self.word(n, self.of(p)) for n in networks}


@dataclass(frozen=True)
class _Call:
    verdict: str
    proof: str | None
    classes: dict[str, list[str]]  # verdict word -> processes that support it
    reasons: list[str]


def judge(facts: NcclFacts) -> NcclReport:
    """The report for these facts: verdict, proof, fallback, per-rank rows, machines, reasons, advice."""
    every = facts.every
    providers = _providers(facts)
    chosen: Chosen = {p.key: _chosen(facts, p) for p in every}
    selected = uniq([n for p in every for n in chosen[p.key][0]])
    nnodes_decl = max([p.nnodes for p in every if p.nnodes] or [0]) or None
    hosts = find_hosts(list(facts.processes), nnodes_decl, facts.duplicate_gpu)
    machines = sum(h.machines for h in hosts)
    call = _call(facts, providers, chosen, selected, nnodes_decl, hosts)
    reasons = call.reasons + _machine_reasons(hosts, nnodes_decl)
    fallback, attempted = _fallback(facts, chosen, call, selected, providers, reasons)
    rows = _rank_rows(facts, providers, chosen, selected, call.verdict, {k: h.host for h in hosts for k in h.processes})
    net_procs = [p for p in every if p.nets]
    report = NcclReport(
        verdict=call.verdict, proof=call.proof if call.verdict != "unknown" else None, fallback=fallback,
        fallback_from=attempted if fallback else None, gdr=all(p.gdr for p in net_procs) if net_procs else None,
        nccl_version=", ".join(uniq([p.version for p in every])) or None,
        plugin=", ".join(uniq([p.plugin for p in every])) or None,
        plugin_version=", ".join(uniq([p.plugin_version for p in every])) or None,
        provider=", ".join(providers.names) or None,
        fabric=", ".join(uniq([p.fabric for p in every])) or None,
        network=", ".join(selected) or None,
        nodes=max(nnodes_decl or 0, machines) or None, ranks=rows, errors=list(facts.errors),
        evidence=sorted(facts.evidence, key=lambda e: (e.source, e.line)), failures=list(facts.failures), reasons=reasons,
        causes=[], env=dict(facts.env), sources=list(facts.sources), lines=facts.lines, candidates=facts.candidates,
        folded_repeats=facts.folded_repeats, hosts=_judged_hosts(hosts, rows),
    )
    report.reasons.extend(_mixed_machines(report.hosts))
    report.causes = likely_causes(report)
    return report


def _providers(facts: NcclFacts) -> _Providers:
    """Named providers, else the EFA the plugin's wording or libfabric's efa endpoint log implies."""
    every = facts.every
    names = uniq([p.provider for p in every])
    hinted: str | None = None
    if not names:
        if any(p.implied_provider for p in every):
            names, hinted = ["efa"], "the plugin's EFA-only wording (Setting provider_filter to efa / Forcing AWS OFI ndev)"
        elif facts.provider_hint is not None:
            names, hinted = ["efa"], f"{_HINTS.get(facts.provider_hint.kind, _HINTS['provider'])}, line {facts.provider_hint.line}"
    one = names[0] if len(names) == 1 else None
    gdr = any(is_libfabric(n) and f"NET/{n}/GDRDMA" in p.transports and (p.provider or p.implied_provider or one) is None
              for p in every for n in p.nets)
    return _Providers(names, hinted, one, gdr)


_HINTS = {"provider": "libfabric's efa endpoint log", "efa-address": "an EFA endpoint address (fi_addr_efa)",
          "efa-device": "an EFA device name (efa_<k>)"}


def _chosen(facts: NcclFacts, p: Process) -> tuple[list[str], str | None]:
    """The network a process reported choosing, and the rule that says so, strongest first."""
    if p.selected:  # rule network: NCCL's own word
        return list(p.selected), "network"
    if p.inits:  # rule net-init: the first plugin to initialise is assigned (NCCL >= 2.27)
        return list(p.inits), "net-init"
    pinned = facts.env.get("NCCL_NET", "").strip().lower()
    failed = p.ofi_failed or facts.unattributed.ofi_failed
    old_24 = _is_nccl_240_247(p.version or facts.unattributed.version)
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


def _call(facts: NcclFacts, providers: _Providers, chosen: Chosen, selected: list[str], nnodes_decl: int | None,
          hosts: list[HostInfo]) -> _Call:
    """Verdict and proof: traffic over a network if channel lines show it, else one host, else what was selected."""
    every = facts.every
    machines = sum(h.machines for h in hosts)
    carried: dict[str, list[str]] = {}
    sel_only: dict[str, list[str]] = {}
    for p in every:
        if p.nets:
            for c in sorted(providers.words(p, p.nets)):
                carried.setdefault(c, []).append(p.key)
        else:
            for c in sorted(providers.words(p, chosen[p.key][0])):
                sel_only.setdefault(c, []).append(p.key)
    any_channel = any(p.transports for p in every)
    ranked = [p for p in every if p.nranks]
    one_rank = bool(ranked) and all(p.nranks == 1 for p in ranked)
    single = machines <= 1 and (nnodes_decl or 1) <= 1 and (any_channel or nnodes_decl == 1 or one_rank)
    reasons: list[str] = []
    classes: dict[str, list[str]] = {}
    proof: str | None = None
    if carried:
        classes = {c: list(k) for c, k in carried.items()}
        # A multi-node communicator: every rank's choice counts. Otherwise a rank that only selected
        # counts where another rank of its machine carried traffic: it belongs to the same job there.
        host_of = {k: h.host for h in hosts for k in h.processes}
        busy = {host_of[k] for keys in carried.values() for k in keys if k in host_of}
        for c, keys in sel_only.items():
            keys = [k for k in keys if k != "*" and ((nnodes_decl or 0) >= 2 or host_of.get(k) in busy)]
            if keys:
                classes.setdefault(c, []).extend(keys)
        proof = "carried" if len(carried) == len(classes) else "selected"
    elif single:
        if any_channel:
            reasons.append("no channel crossed a network: all peers connected over P2P/SHM/NVLS on one host")
        else:
            reasons.append(("communicators report nNodes 1" if nnodes_decl == 1 else "every communicator has a single rank")
                           + "; no channel lines, so the traffic itself is not in the log")
        if selected:
            reasons.append(f"NCCL selected {', '.join(selected)}, but nothing crossed it")
        return _Call("single-node", "carried" if any_channel else "selected", {}, reasons)
    elif sel_only:
        classes, proof = sel_only, "selected"
    if classes:
        return _classified(facts, providers, chosen, classes, proof, bool(carried), selected, any_channel)
    if any_channel and machines > 1:
        reasons.append(f"{machines} machines, but the log shows only intra-node channels (P2P/SHM): the inter-node connections are not in it")
    else:
        reasons.append("no channel lines, no network selection and no multi-node communicator in the log: not enough evidence"
                       if (any(p.version for p in every) or facts.processes or facts.errors) else "no NCCL output found (is NCCL_DEBUG=INFO set?)")
    return _Call("unknown", None, {}, reasons)


def _classified(facts: NcclFacts, providers: _Providers, chosen: Chosen, classes: dict[str, list[str]], proof: str | None,
                carried: bool, selected: list[str], any_channel: bool) -> _Call:
    """The verdict once the processes are sorted into verdict words: one word is the verdict, several are `mixed`."""
    every = facts.every
    reasons: list[str] = []
    if len(classes) > 1:
        reasons.append("ranks disagree: " + "; ".join(f"{c}: {', '.join(k[:6])}{' …' if len(k) > 6 else ''}" for c, k in sorted(classes.items())))
        return _Call("mixed", proof, classes, reasons)
    c = next(iter(classes))
    names = ", ".join(sorted({n for p in every for n in p.nets})) if carried else ", ".join(selected)
    if c == "libfabric?":
        reasons.append(f"the OFI plugin's network ({names}) {'carried the traffic' if carried else 'was selected'}, but the log never "
                       "says which provider it used: 'Libfabric' is the plugin's name for any provider, not proof of EFA")
        return _Call("unknown", None, classes, reasons)
    if c in ("unknown", "mixed"):
        reasons.append("inter-node traffic over an unrecognised network: " + (names or "?"))
        return _Call(c if c == "mixed" else "unknown", None, classes, reasons)
    if c == "libfabric":
        reasons.append(f"the OFI plugin's network ({names}) {'carried the traffic' if proof == 'carried' else 'was selected'} "
                       "with GPUDirect RDMA (GDRDMA channel lines), but no line proves the provider: no 'Selected provider is efa', "
                       "fi_addr_efa address or efa_<k> device. 'Libfabric' is the plugin's name for any provider, not proof of EFA")
        return _Call(c, proof, classes, reasons)
    if proof == "carried":
        reasons.append(f"inter-node traffic over {names} per channel lines")
    else:
        reasons.insert(0, _selected_sentence(every, chosen, any_channel))
    if c in ("efa", "libfabric-other"):
        reasons.append(f"OFI provider: {', '.join(providers.names)}" + (f" (from {providers.hinted})" if providers.hinted else ""))
    if c == "ib" and any(p.roce for p in every):
        reasons.append("the IB transport runs over RoCE (the device list says /RoCE)")
    return _Call(c, proof, classes, reasons)


def _machine_reasons(hosts: list[HostInfo], nnodes_decl: int | None) -> list[str]:
    """How many nodes, and how machines that share a name were told apart."""
    reasons: list[str] = []
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
    return reasons


def _fallback(facts: NcclFacts, chosen: Chosen, call: _Call, selected: list[str], providers: _Providers,
              reasons: list[str]) -> tuple[bool, str | None]:
    """Whether a faster transport failed and NCCL went on with a slower one; appends what it says to `reasons`."""
    attempted = _attempted(facts, chosen)
    landed = call.verdict if call.verdict in SPEED else None
    if landed is None and selected:
        sel = {providers.word(n, providers.one) for n in selected}
        if len(sel) == 1 and next(iter(sel)) in SPEED:
            landed = next(iter(sel))
    fallback = bool(attempted and landed and SPEED[landed] < SPEED[attempted])
    if fallback:
        reasons.append(f"fallback: {attempted} failed and NCCL went on with {landed}")
    elif attempted and not landed and call.verdict != "mixed":  # mixed: said per rank below
        reasons.append(f"{attempted} failed (see failures) and the log does not show what NCCL used instead")
    if facts.folded_repeats:
        reasons.append(f"Ray folded {facts.folded_repeats} repeated lines ('[repeated Nx across cluster]'): those ranks are not all listed; "
                       "set RAY_DEDUP_LOGS=0 or read the session logs for every rank")
    if facts.net_missing:
        reasons.append(f"NCCL_NET asks for network {facts.net_missing!r}, which NCCL could not find: the job stopped instead of falling back")
    if call.verdict == "mixed" and attempted and any(SPEED.get(c, 9) < SPEED[attempted] for c in call.classes):
        fallback = True
        reasons.append(f"fallback on some ranks: {attempted} failed there")
    return fallback, attempted


def _attempted(facts: NcclFacts, chosen: Chosen) -> str | None:
    """The faster transport that the log shows failing (or present but unused), if any."""
    if facts.ofi_failed or facts.efa_failed:
        return "efa"
    if facts.env.get("NCCL_NET", "").strip().lower().startswith("socket"):
        return None  # sockets on purpose
    every = facts.every
    plugins = {p.plugin for p in every if p.plugin}
    # The OFI plugin was there (its lines, a provider) on a machine whose traffic went over sockets.
    ofi_nodes = {p.node for p in every if p.provider or p.implied_provider or (p.plugin and _is_ofi(p.plugin))}
    socket_nodes = _socket_nodes(every, chosen)
    if ofi_nodes and socket_nodes and (None in ofi_nodes or ofi_nodes & socket_nodes):
        return "efa"
    if facts.plugin_failed:
        texts = " ".join(e.text.lower() for e in facts.failures)
        ofi = any(p.plugin == "aws-ofi-nccl" for p in facts.processes) or "ofi" in texts or "libfabric" in texts
        return "efa" if ofi else "net plugin"
    if facts.ib_failed or (facts.ib_nodev is not None and facts.ib_expected):
        return "ib"
    if any(p.startswith("HPC-X") for p in plugins) and socket_nodes:
        return "ib"
    return None


def _socket_nodes(every: list[Process], chosen: Chosen) -> set[str | None]:
    """Hosts (None: unprefixed lines) whose traffic went over sockets, or that chose sockets when no traffic is shown."""
    carried = any(p.nets for p in every)
    return {p.node for p in every if any(n.lower().startswith("socket") for n in (p.nets if carried else chosen[p.key][0]))}


def _rank_rows(facts: NcclFacts, providers: _Providers, chosen: Chosen, selected: list[str], verdict: str,
               host_of: dict[str, str]) -> list[RankInfo]:
    """One row per process, ranks first: what it is and what carried (or would carry) its inter-node traffic."""
    plugins = uniq([p.plugin for p in facts.every])
    version = facts.unattributed.version
    rows: list[RankInfo] = []
    for p in sorted(facts.processes, key=_proc_order):
        prov = providers.of(p)
        inter: str | None = None
        rproof: str | None = None
        if p.nets:
            cs = sorted(providers.words(p, p.nets))
            inter, rproof = (cs[0] if len(cs) == 1 else "mixed"), "carried"
        elif verdict != "single-node" and chosen[p.key][0]:
            cs = sorted(providers.words(p, chosen[p.key][0]))
            inter, rproof = (cs[0] if len(cs) == 1 else "mixed") + "*", "selected"
        names = chosen[p.key][0]
        rows.append(RankInfo(
            key=p.key, rank=p.rank, nranks=p.nranks or None, node=p.node, ip=p.ip or primary_addr(p), pid=p.pid,
            device=p.device, nccl_version=p.version or version, plugin=p.plugin or (plugins[0] if len(plugins) == 1 else None),
            provider=prov, fabric=p.fabric, network=(names[-1] if names else (selected[0] if len(selected) == 1 else None)),
            transports=sorted(p.transports), inter_node=inter, gdr=(p.gdr if p.nets else None), errors=p.errors,
            proof=rproof, host=host_of.get(p.key),
        ))
    return rows


def _judged_hosts(hosts: list[HostInfo], rows: list[RankInfo]) -> list[HostInfo]:
    """Each machine with what carried its processes' traffic: one word, or `mixed`, the strongest proof, and which ranks had which."""
    by_key = {r.key: r for r in rows}
    out = []
    for h in hosts:
        judged = sorted((by_key[k] for k in h.processes if k in by_key and by_key[k].inter_node),
                        key=lambda r: (r.rank is None, r.rank or 0, r.key))
        by_word: dict[str, list[str]] = {}
        for r in judged:
            by_word.setdefault((r.inter_node or "").rstrip("*"), []).append(r.key if r.rank is None else str(r.rank))
        if by_word:
            h = replace(h, inter_node=next(iter(by_word)) if len(by_word) == 1 else "mixed",
                        proof="carried" if any(r.proof == "carried" for r in judged) else "selected",
                        inter_node_ranks=dict(sorted(by_word.items())))
        out.append(h)
    return out


def _mixed_machines(hosts: list[HostInfo]) -> list[str]:
    """One reason per machine whose ranks used different transports, naming the ranks on each."""
    out = []
    for h in hosts:
        if h.inter_node == "mixed":
            parts = "; ".join(f"{w}: {_rank_list(rs)}" for w, rs in h.inter_node_ranks.items())
            out.append(f"{h.host}: ranks of one machine on different transports — {parts}")
    return out


def _rank_list(ranks: list[str]) -> str:
    numbered = [r for r in ranks if r.isdigit()]
    named = [r for r in ranks if not r.isdigit()]
    return ", ".join(([f"rank{'s' if len(numbered) > 1 else ''} {', '.join(numbered)}"] if numbered else []) + named)


def _selected_sentence(every: list[Process], chosen: Chosen, any_channel: bool) -> str:
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
        provs = uniq([p.provider for p in every if chosen[p.key][1] == "provider"])
        parts.append(f"the OFI plugin came up with provider {', '.join(provs)} (NCCL takes a plugin that initialises)")
    gap = "no channel line crosses a network" if any_channel else "no channel lines"
    return (f"{'; '.join(parts) or 'a network was selected'}; {gap}, so traffic is not proven — "
            "run with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET to see them")


def _is_ofi(plugin: str) -> bool:
    return plugin == "aws-ofi-nccl" or "libfabric" in plugin.lower()


def _is_nccl_240_247(version: str | None) -> bool:
    m = re.match(r"2\.4\.(\d+)", version or "")
    return bool(m) and int(m.group(1)) <= 7


def _proc_order(p: Process) -> tuple[int, str]:
    return (p.rank if p.rank is not None else 1 << 30, p.key)
