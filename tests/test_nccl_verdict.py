"""The NCCL verdict on facts written by hand: no log line is parsed here, so each rule of `judge` is seen alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raydlc.nccl import EXPECTABLE, Evidence, NcclFacts, Process, expect_ok, judge
from raydlc.nccl.machines import hosts


def proc(host: str, pid: int, dev: int = 0, *, rank: int | None = None, nranks: int = 0, addr: str | None = None, **kw) -> Process:
    """A process as a `host:pid:tid [dev]` prefix makes it; `addr` is its bootstrap address."""
    addrs = {"bootstrap": (frozenset({addr}),)} if addr else {}
    return Process(key=f"{host}:{pid}:{dev}", node=host, pid=pid, device=dev, rank=rank, nranks=nranks, addrs=addrs, **kw)


def two_nodes(**kw) -> tuple[Process, ...]:
    """Ranks 0 and 1 of a 2-rank communicator on two hosts, with whatever facts `kw` adds to both."""
    return (proc("node-a", 11, rank=0, nranks=2, nnodes=2, **kw), proc("node-b", 22, rank=1, nranks=2, nnodes=2, **kw))


EFA = {"nets": frozenset({"Libfabric"}), "transports": frozenset({"NET/Libfabric/GDRDMA"}), "gdr": True, "provider": "efa",
       "fabric": "efa-direct", "plugin": "aws-ofi-nccl"}
SOCKET = {"nets": frozenset({"Socket"}), "transports": frozenset({"NET/Socket"})}


def test_efa_carried_by_channel_lines() -> None:
    r = judge(NcclFacts(processes=two_nodes(**EFA)))
    assert (r.verdict, r.proof, r.fallback, r.gdr, r.nodes, r.provider) == ("efa", "carried", False, True, 2, "efa")
    assert [(x.rank, x.inter_node, x.proof, x.host) for x in r.ranks] == [(0, "efa", "carried", "node-a"), (1, "efa", "carried", "node-b")]
    assert [(h.host, h.inter_node, h.proof) for h in r.hosts] == [("node-a", "efa", "carried"), ("node-b", "efa", "carried")]
    assert "inter-node traffic over Libfabric per channel lines" in r.reasons and "OFI provider: efa" in r.reasons
    assert expect_ok(r, "efa") and not r.causes


def test_efa_selected_only_is_not_carried() -> None:
    r = judge(NcclFacts(processes=two_nodes(selected=("Libfabric",), provider="efa", plugin="aws-ofi-nccl")))
    assert (r.verdict, r.proof, r.gdr, r.network) == ("efa", "selected", None, "Libfabric")
    assert {x.inter_node for x in r.ranks} == {"efa*"} and {x.proof for x in r.ranks} == {"selected"}
    assert r.reasons[0].startswith("NCCL selected Libfabric; no channel lines, so traffic is not proven")
    assert not expect_ok(r, "efa") and expect_ok(r, "efa", accept_selected=True)


def test_the_plugin_coming_up_with_efa_is_a_selection() -> None:
    r = judge(NcclFacts(processes=two_nodes(choices=(("provider", "Libfabric"),), provider="efa")))
    assert (r.verdict, r.proof) == ("efa", "selected")
    assert "the OFI plugin came up with provider efa" in r.reasons[0]


@pytest.mark.parametrize(("hint", "why"), [
    ({"implied_provider": "efa"}, "the plugin's EFA-only wording"),
    ({}, "libfabric's efa endpoint log, line 7"),
])
def test_an_implied_efa_provider_says_where_it_came_from(hint: dict, why: str) -> None:
    procs = two_nodes(nets=frozenset({"Libfabric"}), **hint)
    lf = None if hint else Evidence("provider", "w.log", 7, "libfabric:1:1:efa:ep_ctrl:x():1<warn> y")
    r = judge(NcclFacts(processes=procs, provider_hint=lf))
    assert (r.verdict, r.proof, r.provider) == ("efa", "carried", "efa")
    assert any(why in x for x in r.reasons)


def test_socket_carried_without_any_failure_is_no_fallback() -> None:
    r = judge(NcclFacts(processes=two_nodes(**SOCKET)))
    assert (r.verdict, r.proof, r.fallback, r.fallback_from, r.gdr) == ("socket", "carried", False, None, False)
    assert expect_ok(r, "socket") and not expect_ok(r, "efa")


def test_ib_selected_by_its_device_list_and_roce_is_said() -> None:
    r = judge(NcclFacts(processes=two_nodes(choices=(("probe", "IB"),), roce=True)))
    assert (r.verdict, r.proof) == ("ib", "selected")
    assert "NCCL's IB transport initialised with devices" in r.reasons[0]
    assert "the IB transport runs over RoCE (the device list says /RoCE)" in r.reasons


@pytest.mark.parametrize("provider", ["tcp", "cxi", "tcp;ofi_rxm"])
def test_libfabric_over_another_provider_is_libfabric_other(provider: str) -> None:
    r = judge(NcclFacts(processes=two_nodes(nets=frozenset({"Libfabric"}), provider=provider)))
    assert (r.verdict, r.proof) == ("libfabric-other", "carried")
    assert any(f"selected provider {provider!r}, not efa" in c for c in r.causes)


def test_libfabric_without_a_provider_or_gdrdma_is_unknown_never_efa() -> None:
    r = judge(NcclFacts(processes=two_nodes(nets=frozenset({"Libfabric"}), transports=frozenset({"NET/Libfabric"}))))
    assert (r.verdict, r.proof, r.gdr) == ("unknown", None, False)
    assert {x.inter_node for x in r.ranks} == {"libfabric?"}
    assert any("not proof of EFA" in x for x in r.reasons)


GDR_LIBFABRIC = {"nets": frozenset({"Libfabric"}), "transports": frozenset({"NET/Libfabric/GDRDMA"}), "gdr": True}


def test_libfabric_gdrdma_without_a_provider_is_libfabric_provider_unproven() -> None:
    r = judge(NcclFacts(processes=two_nodes(**GDR_LIBFABRIC)))
    assert (r.verdict, r.proof, r.gdr, r.provider, r.fallback) == ("libfabric", "carried", True, None, False)
    assert {x.inter_node for x in r.ranks} == {"libfabric"} and {h.inter_node for h in r.hosts} == {"libfabric"}
    assert "no line proves the provider" in r.reasons[0] and "not proof of EFA" in r.reasons[0]
    assert not expect_ok(r, "efa") and not expect_ok(r, "efa", accept_selected=True)
    assert any("FI_PROVIDER=efa" in c for c in r.causes)


def test_ranks_that_only_selected_libfabric_join_the_gdrdma_ones() -> None:
    a = proc("node-a", 11, rank=0, nranks=2, nnodes=2, **GDR_LIBFABRIC)
    b = proc("node-b", 22, rank=1, nranks=2, nnodes=2, selected=("Libfabric",))
    r = judge(NcclFacts(processes=(a, b)))
    assert (r.verdict, r.proof) == ("libfabric", "carried")
    assert [x.inter_node for x in r.ranks] == ["libfabric", "libfabric*"]


@pytest.mark.parametrize(("kind", "said"), [
    ("efa-address", "an EFA endpoint address (fi_addr_efa), line 3"),
    ("efa-device", "an EFA device name (efa_<k>), line 3"),
    ("provider", "libfabric's efa endpoint log, line 3"),
])
def test_a_line_proving_efa_turns_gdrdma_libfabric_into_efa(kind: str, said: str) -> None:
    hint = Evidence(kind, "w.log", 3, "…")
    r = judge(NcclFacts(processes=two_nodes(**GDR_LIBFABRIC), provider_hint=hint))
    assert (r.verdict, r.proof, r.provider) == ("efa", "carried", "efa")
    assert f"OFI provider: efa (from {said})" in r.reasons


def test_ranks_on_different_transports_are_mixed() -> None:
    a, b = proc("node-a", 11, rank=0, nranks=2, **EFA), proc("node-b", 22, rank=1, nranks=2, **SOCKET)
    r = judge(NcclFacts(processes=(a, b)))
    assert (r.verdict, r.proof, r.fallback) == ("mixed", "carried", False)
    assert r.reasons[0] == "ranks disagree: efa: node-a:11:0; socket: node-b:22:0"
    assert any("ranks disagree: compare the nodes" in c for c in r.causes)
    # ... and with the OFI plugin failing somewhere, the socket ranks fell back.
    r = judge(NcclFacts(processes=(a, replace(b, ofi_failed=True)), ofi_failed=True))
    assert (r.verdict, r.fallback, r.fallback_from) == ("mixed", True, "efa")
    assert "fallback on some ranks: efa failed there" in r.reasons


def test_a_multi_node_communicator_counts_ranks_that_only_selected() -> None:
    a = proc("node-a", 11, rank=0, nranks=2, nnodes=2, **EFA)
    b = proc("node-b", 22, rank=1, nranks=2, nnodes=2, selected=("Socket",))
    r = judge(NcclFacts(processes=(a, b)))
    assert (r.verdict, r.proof) == ("mixed", "selected")  # one side is only a selection
    assert [x.inter_node for x in r.ranks] == ["efa", "socket*"]


def test_intra_node_channels_on_one_host_are_single_node_carried() -> None:
    procs = tuple(proc("box", 10 + i, i, rank=i, nranks=4, transports=frozenset({"P2P/IPC"})) for i in range(4))
    r = judge(NcclFacts(processes=procs))
    assert (r.verdict, r.proof, r.nodes) == ("single-node", "carried", 1)
    assert r.reasons == ["no channel crossed a network: all peers connected over P2P/SHM/NVLS on one host"]
    assert all(x.inter_node is None for x in r.ranks)


def test_nnodes_1_without_channels_is_single_node_selected() -> None:
    r = judge(NcclFacts(processes=(proc("box", 10, rank=0, nranks=8, nnodes=1, selected=("Socket",)),)))
    assert (r.verdict, r.proof) == ("single-node", "selected")
    assert r.reasons[0].startswith("communicators report nNodes 1") and "NCCL selected Socket, but nothing crossed it" in r.reasons


def test_two_hosts_with_only_intra_node_channels_are_unknown() -> None:
    procs = (proc("node-a", 11, transports=frozenset({"P2P/IPC"})), proc("node-b", 22, transports=frozenset({"SHM"})))
    r = judge(NcclFacts(processes=procs))
    assert (r.verdict, r.proof, r.nodes) == ("unknown", None, 2)
    assert "2 machines, but the log shows only intra-node channels" in r.reasons[0]


def test_nothing_at_all_is_unknown_with_the_reason() -> None:
    r = judge(NcclFacts())
    assert (r.verdict, r.proof, r.fallback, r.nodes, r.ranks, r.hosts) == ("unknown", None, False, None, [], [])
    assert r.reasons == ["no NCCL output found (is NCCL_DEBUG=INFO set?)"]
    r = judge(NcclFacts(unattributed=Process(key="*", version="2.29.7+cuda13.0")))
    assert r.nccl_version == "2.29.7+cuda13.0" and "not enough evidence" in r.reasons[0]


def test_ofi_failure_then_sockets_is_a_fallback_from_efa() -> None:
    fail = Evidence("ofi", "w.log", 3, "h:1:1 [0] nccl_net_ofi_init:155 NCCL WARN NET/OFI aws-ofi-nccl initialization failed")
    r = judge(NcclFacts(processes=two_nodes(**SOCKET), ofi_failed=True, failures=(fail,), errors=(fail,)))
    assert (r.verdict, r.fallback, r.fallback_from) == ("socket", True, "efa")
    assert "fallback: efa failed and NCCL went on with socket" in r.reasons
    assert any("NCCL_NET is not pinned" in c for c in r.causes)
    assert not expect_ok(r, "socket")


def test_the_ofi_plugin_present_where_sockets_carried_is_a_fallback_unless_sockets_were_pinned() -> None:
    procs = two_nodes(plugin="aws-ofi-nccl", **SOCKET)
    assert judge(NcclFacts(processes=procs)).fallback_from == "efa"
    assert judge(NcclFacts(processes=procs, env={"NCCL_NET": "Socket"})).fallback is False


def test_ib_wanted_but_absent_then_sockets_is_a_fallback_from_ib() -> None:
    nodev = Evidence("ib", "w.log", 2, "h:1:1 [0] NCCL INFO NET/IB : No device found.")
    r = judge(NcclFacts(processes=two_nodes(**SOCKET), ib_expected=True, ib_failed=True, ib_nodev=nodev, failures=(nodev,)))
    assert (r.verdict, r.fallback, r.fallback_from) == ("socket", True, "ib")
    assert any("InfiniBand" in c for c in r.causes) and not any("vpc.amazonaws.com/efa" in c for c in r.causes)


def test_a_failure_with_nothing_after_it_says_so() -> None:
    r = judge(NcclFacts(ofi_failed=True))
    assert (r.verdict, r.fallback) == ("unknown", False)
    assert "efa failed (see failures) and the log does not show what NCCL used instead" in r.reasons


def test_pinned_network_missing_and_folded_repeats_are_said() -> None:
    r = judge(NcclFacts(processes=two_nodes(**EFA), net_missing="AWS Libfabric", folded_repeats=7))
    assert any("RAY_DEDUP_LOGS=0" in x for x in r.reasons) and any("'AWS Libfabric'" in x for x in r.reasons)
    assert r.folded_repeats == 7


def test_judge_is_pure() -> None:
    facts = NcclFacts(processes=two_nodes(**EFA))
    assert judge(facts).as_dict() == judge(facts).as_dict()
    assert facts == NcclFacts(processes=two_nodes(**EFA))


def test_every_expectable_verdict_can_pass_the_gate() -> None:
    cases = {"efa": NcclFacts(processes=two_nodes(**EFA)), "socket": NcclFacts(processes=two_nodes(**SOCKET)),
             "ib": NcclFacts(processes=two_nodes(nets=frozenset({"IB"}))),
             "single-node": NcclFacts(processes=(proc("box", 1, rank=0, nranks=2, transports=frozenset({"SHM"})),))}
    assert set(cases) == set(EXPECTABLE)
    for want, facts in cases.items():
        r = judge(facts)
        assert r.verdict == want and expect_ok(r, want), (want, r.reasons)


def test_a_rank_that_only_selected_counts_on_a_machine_that_carried() -> None:
    a0 = proc("node-a", 11, 0, rank=0, nranks=4, **EFA)
    a1 = proc("node-a", 12, 1, rank=1, nranks=4, selected=("Socket",))
    b2 = proc("node-b", 21, 0, rank=2, nranks=4, **EFA)
    r = judge(NcclFacts(processes=(a0, a1, b2)))
    assert (r.verdict, r.proof) == ("mixed", "selected")
    hosts_ = {h.host: h for h in r.hosts}
    assert (hosts_["node-a"].inter_node, hosts_["node-a"].inter_node_ranks) == ("mixed", {"efa": ["0"], "socket": ["1"]})
    assert (hosts_["node-b"].inter_node, hosts_["node-b"].inter_node_ranks) == ("efa", {"efa": ["2"]})
    assert "node-a: ranks of one machine on different transports — efa: rank 0; socket: rank 1" in r.reasons
    # A process that only selected, on a machine where nothing carried, is still not counted (nNodes unknown).
    c3 = proc("node-c", 31, 0, rank=3, nranks=4, selected=("Socket",))
    assert judge(NcclFacts(processes=(a0, b2, c3))).verdict == "efa"


def test_ranks_of_one_machine_on_two_carried_transports_are_named() -> None:
    procs = (proc("box", 1, 0, rank=0, nranks=4, **EFA), proc("box", 2, 1, rank=1, nranks=4, **EFA),
             proc("box", 3, 2, rank=2, nranks=4, **SOCKET), proc("box", 4, 3, **SOCKET))
    r = judge(NcclFacts(processes=procs))
    [h] = r.hosts
    assert (r.verdict, r.proof, h.inter_node) == ("mixed", "carried", "mixed")
    assert h.inter_node_ranks == {"efa": ["0", "1"], "socket": ["2", "box:4:3"]}
    assert "box: ranks of one machine on different transports — efa: ranks 0, 1; socket: rank 2, box:4:3" in r.reasons


# --- machines, on hand-built processes ------------------------------------------------------
def test_one_hostname_with_two_bootstrap_addresses_is_two_machines() -> None:
    a, b = proc("ubuntu", 7, addr="10.0.0.1", **SOCKET), proc("ubuntu", 8, addr="10.0.0.2", **SOCKET)
    hs = hosts([a, b], None)
    assert sorted((h.host, h.machines, h.told_by) for h in hs) == [("ubuntu (10.0.0.1)", 1, "addresses"), ("ubuntu (10.0.0.2)", 1, "addresses")]
    r = judge(NcclFacts(processes=(a, b)))
    assert r.nodes == 2 and any("2 machines share the hostname 'ubuntu'" in x for x in r.reasons)


def test_a_prefix_holding_two_ranks_of_one_communicator_is_two_machines() -> None:
    p = proc("ubuntu", 61, rank=0, nranks=2, twins=(1,))
    [h] = hosts([p], None)
    assert h.machines == 2 and "holds ranks 0, 1 of one communicator" in h.why[0]


def test_a_shared_bus_id_splits_machines_unless_nccl_said_duplicate_gpu() -> None:
    a = proc("node", 11, rank=0, nranks=2, joined={"0xfeed": (0, "1b000")})
    b = proc("node", 12, rank=1, nranks=2, joined={"0xfeed": (1, "1b000")})
    assert [h.machines for h in hosts([a, b], None)] == [2]
    assert [h.machines for h in hosts([a, b], None, duplicate_gpu=True)] == [1]


def test_a_caller_named_machine_settles_it() -> None:
    a = Process(key="ubuntu:7:0@pod-a", node="ubuntu", pid=7, addrs={"given": (frozenset({"pod-a"}),)}, **SOCKET)
    b = Process(key="ubuntu:7:0@pod-b", node="ubuntu", pid=7, addrs={"given": (frozenset({"pod-b"}),)}, **SOCKET)
    r = judge(NcclFacts(processes=(a, b)))
    assert [(h.host, h.name, h.told_by, h.inter_node) for h in r.hosts] == [("pod-a", "ubuntu", "caller", "socket"),
                                                                             ("pod-b", "ubuntu", "caller", "socket")]
    assert r.nodes == 2


def test_nnodes_above_what_one_hostname_shows_counts_the_nodes() -> None:
    [h] = hosts([proc("ubuntu", 7, rank=0, nranks=16)], 2)
    assert h.machines == 2 and "nNodes 2" in h.why[-1]
