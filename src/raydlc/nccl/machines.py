"""Telling machines apart: hostnames, split by the addresses NCCL printed, counted up by what one host never shows.

Containers that all call themselves `ubuntu` are still several nodes. A machine is told
apart by the caller's node name (per-node logs), else by hostname; one hostname is split
where processes printed different addresses of the same kind (bootstrap, Socket, IB OOB,
Ray's `ip=`, one interface name), and counted up where one process shows two ranks of one
communicator (rule pid-collision), two ranks of one communicator share a GPU bus id (rule
duplicate-gpu), or a communicator has more ranks under one name than its localRanks.
"""

from __future__ import annotations

from raydlc.nccl.facts import Process, uniq
from raydlc.nccl.report import HostInfo


def hosts(procs: list[Process], nnodes_decl: int | None, duplicate_gpu: bool = False) -> list[HostInfo]:
    """The machines these processes ran on; `inter_node`/`proof` are left for the verdict to fill.

    `nnodes_decl` is the largest nNodes a communicator reported; `duplicate_gpu` that NCCL
    itself warned "Duplicate GPU detected" (then a shared bus id is one host, not two).
    """
    named = [p for p in procs if p.node and not p.key.startswith("rank ")]
    owner: dict[str, set[str]] = {}
    for p in named:
        if p.node != p.ip:
            for a in p.all_addrs():
                owner.setdefault(a, set()).add(p.node or "")

    def name_of(p: Process) -> str:
        # A Ray-only prefix names the node by IP: it is the host whose NCCL lines show that IP.
        if p.node == p.ip and p.ip and len(owner.get(p.ip, ())) == 1:
            return next(iter(owner[p.ip]))
        return p.node or ""

    groups: dict[str, list[Process]] = {}
    given: dict[str, list[Process]] = {}
    for p in named:
        g = p.addrs.get("given")
        if g:  # the caller said which machine this came from: that settles it
            given.setdefault(next(iter(g[0])), []).append(p)
        else:
            groups.setdefault(name_of(p), []).append(p)
    out = [_given_host(node, ps) for node, ps in given.items()]
    for name, ps in groups.items():
        out.extend(_named_hosts(name, ps, duplicate_gpu))
    if len(out) == 1 and out[0].told_by == "hostname" and nnodes_decl and nnodes_decl > out[0].machines:
        h = out[0]
        why = [*h.why, f"one hostname, but the communicator reports nNodes {nnodes_decl} (NCCL counts hosts by host hash, not name)"]
        out[0] = HostInfo(h.host, h.name, h.addresses, nnodes_decl, h.processes, h.ranks, h.inter_node, h.proof, why, h.told_by)
    return out


def _given_host(node: str, ps: list[Process]) -> HostInfo:
    names = uniq([p.node for p in ps if p.node != node]) or [node]
    return HostInfo(host=node, name=", ".join(names), addresses=sorted({a for p in ps for a in p.all_addrs()} - {node}),
                    machines=1, processes=sorted(p.key for p in ps), ranks=sorted({p.rank for p in ps if p.rank is not None}),
                    inter_node=None, proof=None, why=["named by the caller (logs grouped per machine)"], told_by="caller")


def _named_hosts(name: str, ps: list[Process], duplicate_gpu: bool) -> list[HostInfo]:
    """The machines behind one hostname: one per address group, each counted by what NCCL would never print on one."""
    clusters = _split_by_address(ps)
    out = []
    for addrs, members in clusters:
        machines, why = _machines_in(members, not duplicate_gpu) if addrs is not None else (0, [])
        if addrs is None:
            why = ["these processes printed no address: they run on one of the machines above"]
        label = name if len(clusters) == 1 else f"{name} ({sorted(addrs)[0]})" if addrs else f"{name} (no address)"
        if len(clusters) > 1 and addrs:
            why.insert(0, f"hostname {name!r} is shared by machines with different addresses; this one: {', '.join(sorted(addrs))}")
        out.append(HostInfo(host=label, name=name, addresses=sorted(addrs or ()), machines=machines,
                            processes=sorted(p.key for p in members), ranks=sorted({p.rank for p in members if p.rank is not None}),
                            inter_node=None, proof=None, why=why, told_by="addresses" if len(clusters) > 1 else "hostname"))
    return out


def _split_by_address(ps: list[Process]) -> list[tuple[set[str] | None, list[Process]]]:
    """Processes of one hostname, grouped into machines by the addresses they printed.

    Processes that share an address are one machine. Groups stay apart only when they are
    provably different: both printed an address of the same kind (bootstrap, socket, ib,
    ray, or one interface name) and those addresses differ. Processes without any address
    join their pid's machine or the only machine, or stand apart (address None).
    """
    clusters: list[tuple[dict[str, set[str]], list[Process]]] = []
    bare: list[Process] = []
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
    _merge_compatible(clusters)
    out: list[tuple[set[str] | None, list[Process]]] = [(set().union(*ck.values()), ms) for ck, ms in clusters]
    return _place_bare(out, bare)


def _merge_compatible(clusters: list[tuple[dict[str, set[str]], list[Process]]]) -> None:
    """Merge, in place, address groups that never printed differing addresses of one kind."""
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


def _place_bare(out: list[tuple[set[str] | None, list[Process]]], bare: list[Process]) -> list[tuple[set[str] | None, list[Process]]]:
    """Processes that printed no address: with their pid's machine, the only machine, or apart (address None)."""
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


def _machines_in(members: list[Process], trust_bus_ids: bool = True) -> tuple[int, list[str]]:
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


def _disjoint_count(sets: tuple[frozenset[str], ...]) -> int:
    """How many of these address sets share nothing with each other (a process prints one)."""
    picked: list[frozenset[str]] = []
    for s in sets:
        if all(not (s & t) for t in picked):
            picked.append(s)
    return len(picked)


def primary_addr(p: Process) -> str | None:
    """The address a process is best known by: bootstrap, then Socket, IB OOB, Ray's ip."""
    for kind in ("bootstrap", "socket", "ib", "ray"):
        sets = p.addrs.get(kind)
        if sets:
            return sorted(sets[0])[0]
    return None
