"""NCCL log telemetry against real public log excerpts (tests/data/nccl/MANIFEST.json)."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc.cli import main
from raydlc.errors import InputError
from raydlc.nccl import PROOFS, RULES, VERDICTS, NcclReport, analyze_chunks, analyze_lines, expect_ok
from raydlc.nccl.collect import analyze_node_paths, analyze_paths, expand, log_files

DATA = Path(__file__).resolve().parent / "data" / "nccl"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())


def corpus_files() -> list[Path]:
    out: list[Path] = []
    for e in MANIFEST:
        p = DATA / e["path"]
        out.extend(sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p])
    return out


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["path"] for e in MANIFEST])
def test_corpus_verdict(entry: dict) -> None:
    p = DATA / entry["path"]
    if entry.get("per_node"):  # one directory per machine, as verify groups worker logs per Ray node
        r = analyze_node_paths({d.name: [str(d)] for d in sorted(p.iterdir()) if d.is_dir()})
    else:
        r = analyze_paths([str(p)])
    assert (r.verdict, r.proof, r.fallback) == (entry["verdict"], entry["proof"], entry["fallback"]), r.reasons
    if "gdr" in entry:
        assert r.gdr is entry["gdr"]
    if "errors" in entry:
        assert bool(r.errors) is entry["errors"]
    if "nodes" in entry:
        assert r.nodes == entry["nodes"]
    if "folded_repeats" in entry:
        assert r.folded_repeats == entry["folded_repeats"]
    assert r.reasons, "every verdict says why"


def test_manifest_covers_every_verdict_proof_and_format() -> None:
    assert len(MANIFEST) >= 83
    assert len({e["path"] for e in MANIFEST}) == len(MANIFEST)
    assert {e["verdict"] for e in MANIFEST} == set(VERDICTS)
    assert {True, False} <= {e["fallback"] for e in MANIFEST}
    for e in MANIFEST:
        assert e["proof"] in (*PROOFS, None), e
        assert (e["proof"] is None) == (e["verdict"] == "unknown"), e
    for verdict in ("efa", "socket", "ib", "single-node"):  # no public libfabric-other log with channel lines found
        assert {e["proof"] for e in MANIFEST if e["verdict"] == verdict} == set(PROOFS), verdict
    assert sum(e["fallback"] for e in MANIFEST) >= 6
    formats = " ".join(e["format"] for e in MANIFEST).lower()
    for word in ("cloudwatch", "doubled", "ray driver", "repeated", "ray session", "mpi", "pdsh", "without", "ansi", "glued",
                 "roce", "warn", "trace", "nccl 2.3", "nccl 2.4", "aws-ofi-nccl 1.1", "cut"):
        assert word in formats, word
    for e in MANIFEST:
        assert e["source"].startswith("https://github.com/"), e
        assert (DATA / e["path"]).exists(), e
    assert all(f.stat().st_size < 20_000 for f in corpus_files())


def test_evidence_line_numbers_point_at_the_quoted_line() -> None:
    checked = 0
    for f in corpus_files():
        lines = f.read_text(errors="replace").split("\n")
        r = analyze_paths([str(f)])
        for e in r.evidence + r.errors + r.failures:
            assert e.source == str(f)
            raw = lines[e.line - 1].replace("\x1b", "")
            assert e.text.split(" | ")[-1][:40].replace("\x1b", "") in raw or e.text[:30] in raw, (f, e)
            checked += 1
    assert checked > 200


@pytest.mark.parametrize("name", ["efa_ofi715_cloudwatch_gdr_shared.log", "socket_ray_driver_wrapped_horovod3658.log",
                                  "ib_deepep106_glued_lines_ibext_gdrdma.log", "singlenode_ofi889_cloudwatch_doubled_fallback.log"])
@pytest.mark.parametrize("size", [1, 7, 333, 1 << 20])
def test_chunk_size_does_not_change_the_answer(name: str, size: int) -> None:
    data = (DATA / name).read_bytes()
    whole = analyze_chunks([data], source="x")
    parts = analyze_chunks((data[i:i + size] for i in range(0, len(data), size)), source="x")
    assert parts.as_dict() == whole.as_dict()
    by_lines = analyze_lines(data.decode().splitlines(), source="x")
    assert (by_lines.verdict, by_lines.fallback, [e.line for e in by_lines.evidence]) == (
        whole.verdict, whole.fallback, [e.line for e in whole.evidence])


# --- the rules, on real lines ---------------------------------------------------------
NO_PROVIDER = (DATA / "libfabric_nccl527_multinode_gdr_no_provider.log").read_text().splitlines()


@pytest.mark.parametrize(("provider_line", "verdict"), [
    (None, "libfabric"),  # GDRDMA channels, provider unproven
    ("NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)", "efa"),
    ("NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)", "efa"),
    ("NCCL INFO NET/OFI Selected provider is tcp, fabric is 172.31.64.0/20 (found 1 nics)", "libfabric-other"),
    ("NCCL INFO NET/OFI Selected Provider is cxi (found 8 nics)", "libfabric-other"),
    ("NCCL INFO NET/OFI Selected Provider is tcp;ofi_rxm", "libfabric-other"),
])
def test_libfabric_is_efa_only_with_the_efa_provider(provider_line: str | None, verdict: str) -> None:
    lines = ([provider_line] if provider_line else []) + NO_PROVIDER
    r = analyze_lines(lines)
    assert r.verdict == verdict, r.reasons
    assert r.gdr is True


def test_ranks_that_disagree_are_mixed_not_the_majority() -> None:
    efa = (DATA / "efa_ofi715_cloudwatch_gdr_shared.log").read_text().splitlines()
    one_socket = (DATA / "socket_horovod3658_mpi_prefix.log").read_text().splitlines()[1:2]
    r = analyze_lines(efa + one_socket)
    assert (r.verdict, r.proof) == ("mixed", "carried")
    carried = [x for x in r.ranks if x.proof == "carried"]
    assert {x.inter_node for x in carried} == {"efa", "socket"}
    assert sum(x.inter_node == "efa" for x in carried) > sum(x.inter_node == "socket" for x in carried)


def test_selected_network_without_traffic_is_selected_not_carried() -> None:
    r = analyze_paths([str(DATA / "efa_ofi161_provider_selected_nothing_crossed.log")])
    assert (r.verdict, r.proof, r.provider, r.network) == ("efa", "selected", "efa", "AWS Libfabric")
    assert r.plugin == "aws-ofi-nccl" and r.plugin_version == "1.3.0aws" and r.nccl_version == "2.10.3+cuda11.3"
    assert not expect_ok(r, "efa") and expect_ok(r, "efa", accept_selected=True)
    assert "traffic is not proven" in r.reasons[0] and "NCCL_DEBUG_SUBSYS=INIT,NET" in r.reasons[0]
    assert {x.inter_node for x in r.ranks if x.proof == "selected"} == {"efa*"}


def test_ofi_failure_then_socket_channels_is_a_fallback() -> None:
    failed = (DATA / "singlenode_ofi889_cloudwatch_doubled_fallback.log").read_text().splitlines()[7:10]
    sockets = (DATA / "socket_horovod3658_mpi_prefix.log").read_text().splitlines()
    r = analyze_lines(failed + sockets)
    assert (r.verdict, r.fallback) == ("socket", True)
    assert any("NCCL_NET" in c for c in r.causes) and any("/dev/infiniband" in c for c in r.causes)
    assert len(r.errors) == 3 and all("NET/OFI" in e.text for e in r.failures)


def test_socket_without_any_failure_is_no_fallback() -> None:
    r = analyze_paths([str(DATA / "socket_nccltests188_internal_plugin.log")])
    assert (r.verdict, r.fallback, r.failures, r.plugin) == ("socket", False, [], "internal")


def test_ray_prefix_and_repeat_folding() -> None:
    r = analyze_paths([str(DATA / "efa_ray_driver_wrapped_nccl527.log")])
    keys = {x.key for x in r.ranks}
    assert keys == {"10.0.12.174:4112", "10.0.12.174:4113", "ray-driver-node:7410"}
    rank8 = next(x for x in r.ranks if x.rank == 8)
    assert (rank8.ip, rank8.pid, rank8.inter_node) == ("10.0.12.174", 4112, "efa")
    assert r.folded_repeats == 7 and any("RAY_DEDUP_LOGS" in x for x in r.reasons)


def test_per_rank_rows_carry_host_pid_and_transports() -> None:
    r = analyze_paths([str(DATA / "ib_nccl1412_direct_pointer_nnodes2.log")])
    rows = {x.rank: x for x in r.ranks if x.rank is not None}
    assert rows[6].node == "swat1-04" and rows[6].pid == 2017630 and rows[6].nranks == 16
    five = next(x for x in r.ranks if x.key == "swat1-04:2017630:5")
    assert five.transports == ["NET/IB"] and five.inter_node == "ib" and five.gdr is False


# --- bad input -------------------------------------------------------------------------
def test_binary_garbage_and_empty_input_give_unknown(tmp_path: Path) -> None:
    rnd = random.Random(4)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(rnd.getrandbits(8) for _ in range(300_000)) + b"NCCL INFO \xff\xfe via NET/\x00\n" * 3)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    for p in (junk, empty):
        r = analyze_paths([str(p)])
        assert isinstance(r, NcclReport) and r.verdict == "unknown" and not r.fallback


def test_truncated_last_line_and_invalid_utf8_are_still_read(tmp_path: Path) -> None:
    text = (DATA / "socket_horovod3658_mpi_prefix.log").read_bytes().rstrip(b"\n")
    f = tmp_path / "cut.log"
    f.write_bytes(text.replace(b"ip-172-31-0-63:2121", b"ip-172-31-0-\xe9\xff:2121")[:-9])
    r = analyze_paths([str(f)])
    assert r.verdict == "socket" and r.lines == text.count(b"\n") + 1


def test_gzip_is_read_and_a_truncated_gzip_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = (DATA / "ib_nccl687_gdrdma_two_hosts.log").read_bytes()
    gz = tmp_path / "worker.log.gz"
    gz.write_bytes(gzip.compress(src))
    assert analyze_paths([str(gz)]).verdict == "ib"
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(src)[:-30])
    with pytest.raises(InputError):
        analyze_paths([str(cut)])
    assert main(["nccl", str(cut)]) == 2
    assert "truncated" in capsys.readouterr().err


def test_missing_paths_and_empty_dirs_are_exit_2(tmp_path: Path) -> None:
    assert main(["nccl", str(tmp_path / "nope.log")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["nccl", str(tmp_path / "empty")]) == 2
    assert main(["nccl", str(DATA / "ib_nccl687_gdrdma_two_hosts.log"), "--expect", "roce"]) == 2


def test_session_dir_reads_worker_files_once(tmp_path: Path) -> None:
    root = tmp_path / "ray"
    src = DATA / "ray_session_ib_nccl687"
    for f in src.rglob("*"):
        if f.is_file():
            dst = root / f.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(f.read_bytes())
    session = next(root.glob("session_*"))
    os.symlink(session, root / "session_latest")
    files = log_files(root)
    assert [f.name.split("-")[0] for f in files] == ["worker", "worker"]
    assert len(expand([str(root)])) == 2
    r = analyze_paths([str(root)])
    assert (r.verdict, r.nodes, len(r.sources)) == ("ib", 2, 2)


# --- CLI -----------------------------------------------------------------------------------
def test_cli_json_shape_and_expect_codes(capsys: pytest.CaptureFixture[str]) -> None:
    efa = str(DATA / "efa_nccl527_noprefix_gdr.log")
    assert main(["nccl", efa, "--json", "--expect", "efa"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("verdict", "proof", "fallback", "gdr", "nccl_version", "plugin", "provider", "nodes", "ranks", "hosts", "errors", "evidence"):
        assert key in doc
    assert (doc["verdict"], doc["proof"], doc["gdr"], doc["expect_ok"]) == ("efa", "carried", True, True)
    assert {"rank", "node", "pid", "transports", "inter_node", "proof", "host"} <= set(doc["ranks"][0])
    assert all({"line", "text", "source"} <= set(e) for e in doc["evidence"])
    assert main(["nccl", efa, "--expect", "socket"]) == 3
    fallback = str(DATA / "singlenode_ofi889_cloudwatch_doubled_fallback.log")
    assert main(["nccl", fallback, "--expect", "single-node"]) == 3  # right verdict, but a fallback
    assert main(["nccl", fallback]) == 0  # no --expect: report only
    out = capsys.readouterr().out
    assert "verdict: single-node, carried + FALLBACK" in out
    assert f"{fallback}:8" in out and "likely causes" in out and "NCCL_NET" in out


def test_cli_reads_stdin_and_imports_nothing_heavy(tmp_path: Path) -> None:
    code = (
        "import sys; from raydlc.cli import main; rc = main(['nccl', '-', '--json', '--expect', 'socket']); "
        "print('HEAVY=' + ','.join(m for m in ('torch', 'ray', 'transformers', 'kubernetes', 'boto3') if m in sys.modules)); "
        "sys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    r = subprocess.run([sys.executable, "-c", code], input=(DATA / "socket_nccl278_nccl25_ring.log").read_bytes(),
                       capture_output=True, env=env, cwd=tmp_path, timeout=120)
    out = r.stdout.decode().splitlines()
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(out[0])["verdict"] == "socket" and out[-1] == "HEAVY="


def test_numpy_and_plain_newline_counts_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.nccl import scan

    data = b"".join((DATA / n).read_bytes() * 3 for n in ("socket_nccl952_ibext_no_device_fallback.log", "efa_ofi715_cloudwatch_gdr_shared.log"))
    plain = analyze_chunks([data], source="x")
    monkeypatch.setattr(scan, "NUMPY_MIN", 0)
    vectorised = analyze_chunks((data[i:i + 4096] for i in range(0, len(data), 4096)), source="x")
    assert [(e.line, e.text) for e in vectorised.evidence + vectorised.errors] == [(e.line, e.text) for e in plain.evidence + plain.errors]
    assert vectorised.lines == plain.lines == data.count(b"\n")


def test_pinned_network_missing_is_an_error_not_a_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["ip-10-0-1-17:2210:2291 [0] init.cc:236 NCCL WARN Error: network AWS Libfabric not found."]
    r = analyze_lines(lines)
    assert (r.verdict, r.fallback, len(r.errors)) == ("unknown", False, 1)
    assert any("NCCL_NET" in c for c in r.causes) and any("AWS Libfabric" in x for x in r.reasons)


def test_ib_fallback_gets_ib_advice_not_efa_advice() -> None:
    r = analyze_paths([str(DATA / "socket_nccl952_ibext_no_device_fallback.log")])
    assert r.fallback_from == "ib"
    assert any("InfiniBand" in c for c in r.causes) and not any("vpc.amazonaws.com/efa" in c for c in r.causes)


# Real lines quoted in public troubleshooting notes (found with the code search; their files
# name no stable URL, so they live here as rule tests rather than in the manifest).
GLIBC_PLUGIN_FAILURE = """\
NET/Plugin: libnccl-net.so: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found
NET/IB : No device found.
Failed to initialize NET plugin IB
Initialized NET plugin Socket
Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"""

OFI_1_21_CXX_WARNS = """\
NCCL INFO NCCL version 2.28.3+cuda12.9
NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v11)
NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.21.1
NCCL INFO NET/OFI No eligible providers were found
[2026-09-17 04:02:30] x3002c0s31b0n0:3333526:3333526 [0] int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**):334 NCCL WARN NET/OFI Unable to find a protocol that worked.  Failing initialization.
[2026-09-17 04:02:30] x3002c0s31b0n0:3333526:3333526 [0] int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**):418 NCCL WARN NET/OFI aws-ofi-nccl initialization failed
[2026-09-17 04:02:30] x3002c0s31b0n0:3333526:3333526 [0] ncclResult_t nccl_net_ofi_init(ncclDebugLogger_t):79 NCCL WARN NET/OFI Initializing plugin failed
[2026-09-17 04:02:30] x3002c0s31b0n0:3333526:3333526 [0] plugin/net.cc:306 NCCL WARN Failed to initialize any NET plugin"""


def test_plugin_that_cannot_load_then_sockets_is_a_fallback() -> None:
    # The note quotes these lines with NCCL's "NCCL INFO" marker cut off; restored as NCCL prints it.
    r = analyze_lines(["NCCL INFO " + x for x in GLIBC_PLUGIN_FAILURE.splitlines()])
    assert (r.verdict, r.fallback) == ("socket", True)
    assert "GLIBC_2.38" in r.failures[0].text and r.failures[0].line == 1
    assert any("could not be loaded" in c for c in r.causes)


def test_cxx_signature_warns_keep_their_host_and_stop_without_fallback() -> None:
    r = analyze_lines(OFI_1_21_CXX_WARNS.splitlines())
    assert (r.verdict, r.fallback, r.plugin, r.plugin_version) == ("unknown", False, "aws-ofi-nccl", "1.21.1")
    assert len(r.errors) == 4 and [e.line for e in r.errors] == [5, 6, 7, 8]
    host = next(x for x in r.ranks if x.pid == 3333526)
    assert (host.node, host.errors) == ("x3002c0s31b0n0", 4)


def test_efa_plugin_present_but_sockets_used_is_a_fallback() -> None:
    ok = (DATA / "singlenode_nccl2297_failed_init_ib_socket_one_rank.log").read_text().splitlines()
    with_ofi = ["lab:1425048:1425048 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.19.0"] + ok
    assert analyze_lines(ok).fallback is False
    r = analyze_lines(with_ofi)
    assert (r.verdict, r.fallback, r.fallback_from) == ("single-node", True, "efa")
    pinned = ["lab:1425048:1425048 [0] NCCL INFO NCCL_NET set by environment to Socket"] + with_ofi
    assert analyze_lines(pinned).fallback is False  # sockets on purpose


def test_pipes_are_read_like_files(tmp_path: Path) -> None:
    import threading

    fifo = tmp_path / "kubectl-logs"
    os.mkfifo(fifo)
    payload = gzip.compress((DATA / "socket_horovod3658_mpi_prefix.log").read_bytes())
    writer = threading.Thread(target=lambda: fifo.write_bytes(payload))
    writer.start()
    r = analyze_paths([str(fifo)])
    writer.join(timeout=10)
    assert (r.verdict, r.nodes) == ("socket", 2)


def test_pytorch_error_brings_its_result_code_and_last_error() -> None:
    f = DATA / "unknown_pytorch_distbackenderror_last_error.log"
    for r in (analyze_paths([str(f)]), analyze_lines(f.read_text().splitlines())):
        assert [e.line for e in r.errors] == [1, 2, 3, 4]
        assert r.errors[1].text.startswith("ncclSystemError") and "No route to host" in r.errors[3].text
        assert r.nccl_version == "2.18.6"


def test_mutated_real_lines_never_crash_the_parser() -> None:
    rnd = random.Random(11)
    lines = [x for f in corpus_files() if f.suffix != ".json" for x in f.read_bytes().splitlines()]
    inserts = [b" NCCL ", b"[", b"]", b":", b" via ", b"NET/", b" | ", b"\x1b[3", b"(", b"pid=", b"\n", b"\xff"]
    for _ in range(1500):
        chosen = [bytearray(rnd.choice(lines)) for _ in range(rnd.randrange(1, 8))]
        for c in chosen:
            for _ in range(rnd.randrange(4)):
                if c:
                    i = rnd.randrange(len(c))
                    c[i:i + rnd.randrange(3)] = rnd.choice(inserts)
        data = b"\n".join(bytes(c) for c in chosen)
        size = rnd.randrange(1, 200)
        r = analyze_chunks((data[i:i + size] for i in range(0, len(data), size)), source="fuzz")
        assert r.verdict in VERDICTS and r.lines == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
        analyze_lines(data.split(b"\n"))


@pytest.mark.parametrize("plugin_line", [
    "host:1:257 [0] NCCL INFO NET/Plugin: Could not find: ofi libnccl-net-ofi.so",
    "host:1:257 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net-ofi.so) returned 2 : libnccl-net-ofi.so: cannot open shared object file: No such file or directory",
])
def test_requested_plugin_missing_then_sockets_is_a_fallback(plugin_line: str) -> None:
    r = analyze_lines([plugin_line, "host:1:257 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"])
    assert (r.verdict, r.fallback, r.fallback_from) == ("socket", True, "efa")


def test_newer_channel_flags_still_count_as_network_traffic() -> None:
    r = analyze_lines([
        "host:1:257 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 16 nics)",
        "host:1:257 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA/flush=None",
    ])
    assert (r.verdict, r.gdr) == ("efa", True)


# --- proof: carried vs selected -------------------------------------------------------------
def _only_using_network_socket(tmp_path: Path) -> Path:
    """Real 'Using network Socket' lines, nothing else (from three public logs)."""
    lines = [x for name in ("socket_nccl447_slurm_gcp_selected_two_hosts.log", "socket_nccl857_libibverbs_missing_selected_one_host.log",
                            "socket_nccl360_alibaba_selected_ring_listing.log")
             for x in (DATA / name).read_text().splitlines() if x.endswith("NCCL INFO Using network Socket")]
    assert len(lines) == 6
    f = tmp_path / "using-network-socket.log"
    f.write_text("\n".join(lines) + "\n")
    return f


def test_only_using_network_socket_is_socket_selected_and_fails_expect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _only_using_network_socket(tmp_path)
    r = analyze_paths([str(f)])
    assert (r.verdict, r.proof, r.fallback) == ("socket", "selected", False)
    assert main(["nccl", str(f), "--expect", "socket"]) == 3
    out = capsys.readouterr().out
    assert "NCCL selected Socket; no channel lines, so traffic is not proven" in out
    assert "NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET" in out and "only selected, not carried" in out
    assert main(["nccl", str(f), "--expect", "socket", "--accept-selected"]) == 0
    assert main(["nccl", str(f), "--expect", "socket", "--accept-selected", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (doc["proof"], doc["expect_ok"], doc["accept_selected"]) == ("selected", True, True)
    assert main(["nccl", str(f), "--expect", "efa", "--accept-selected"]) == 3
    assert main(["nccl", str(f), "--accept-selected"]) == 2  # a modifier of --expect, alone it is a mistake


def test_carried_passes_expect_without_accept_selected() -> None:
    r = analyze_paths([str(DATA / "socket_horovod3658_mpi_prefix.log")])
    assert (r.verdict, r.proof) == ("socket", "carried")
    assert expect_ok(r, "socket") and expect_ok(r, "socket", accept_selected=True) and not expect_ok(r, "efa", True)


def test_selection_comes_from_nccl_or_the_plugin_and_the_strongest_word_wins() -> None:
    head = "h1:10:10 [0] NCCL INFO "
    cases = [
        (["NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.1.0.5<0>"], ("ib", "selected")),
        (["NET/IB : No device found.", "NET/Socket : Using [0]eth0:10.1.0.5<0>"], ("socket", "selected")),
        (["NET/IB : Using [RO]; OOB eth0:10.1.0.5<0>"], ("unknown", None)),  # printed with no device: no choice
        (["NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.1.0.5<0>", "Using network Socket"], ("socket", "selected")),
        (["NET/OFI Selected provider is efa, fabric is efa-direct (found 16 nics)"], ("efa", "selected")),
        (["NET/OFI Selected Provider is efa (found 4 nics)", "NET/IB : No device found.", "NET/Socket : Using [0]eth0:10.1.0.5<0>"],
         ("socket", "selected")),  # the plugin came up, then NCCL still went on to Socket: the later word wins
        (["Initialized NET plugin IB", "Assigned NET plugin IB to comm"], ("ib", "selected")),
    ]
    for lines, want in cases:
        r = analyze_lines([head + x for x in lines])
        assert (r.verdict, r.proof) == want, (lines, r.reasons)


def test_a_pinned_nccl_net_overrides_transport_inits() -> None:
    lines = ["h1:10:10 [0] NCCL INFO NCCL_NET set by environment to Socket",
             "h1:10:10 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.1.0.5<0>"]
    assert analyze_lines(lines).verdict == "unknown"  # IB initialised, but Socket was asked for
    assert analyze_lines([*lines, "h1:10:10 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.0.5<0>"]).verdict == "socket"


def test_nccl_24_bootstrap_socket_is_not_the_network() -> None:
    # NCCL 2.4.0-2.4.7 initialised Socket for its bootstrap before the plugin and IB.
    boot = ["g1:7:7 [0] NCCL INFO NET/Socket : Using [0]eth0:10.2.0.1<0>", "g1:7:7 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so)."]
    assert analyze_lines(boot).verdict == "unknown"
    assert analyze_lines([*boot, "g1:7:7 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.2.0.1<0>"]).verdict == "ib"
    assert analyze_lines([*boot, "g1:7:7 [0] NCCL INFO NET/IB : No device found."]).verdict == "socket"
    versioned = ["NCCL version 2.4.2+cuda10.0", boot[0]]
    assert analyze_lines(versioned).verdict == "unknown"
    assert analyze_lines(["NCCL version 2.4.8+cuda10.1", boot[0]]).verdict == "socket"


def test_libfabric_alone_is_never_efa() -> None:
    net = "h1:10:10 [0] NCCL INFO Using network Libfabric"
    chan = "h1:10:12 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA"
    filt = "h1:10:10 [0] NCCL INFO NET/OFI Setting provider_filter to efa"
    plain = chan.replace("/GDRDMA", "")
    for lines, want in (([net], ("unknown", None)), ([plain], ("unknown", None)), ([chan], ("libfabric", "carried")),
                        ([net, chan], ("libfabric", "carried"))):
        r = analyze_lines(lines)
        assert (r.verdict, r.proof) == want, lines
        assert any("not proof of EFA" in x for x in r.reasons)
        assert not expect_ok(r, "efa", accept_selected=True)
    # The plugin's own EFA-only wording settles the provider of a network that is then used...
    assert (analyze_lines([filt, net]).verdict, analyze_lines([filt, net]).proof) == ("efa", "selected")
    assert (analyze_lines([filt, chan]).verdict, analyze_lines([filt, chan]).proof) == ("efa", "carried")
    # ... but on its own it selects nothing (it is printed before the provider search).
    assert analyze_lines([filt]).verdict == "unknown"
    # An explicit non-EFA provider wins over the platform default.
    tcp = "h1:10:10 [0] NCCL INFO NET/OFI Selected Provider is tcp (found 1 nics)"
    assert analyze_lines([tcp, net]).verdict == "libfabric-other"
    # A plugin that came up and then failed selected nothing.
    efa = "h1:10:10 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"
    failed = "h1:10:10 [0] nccl_net_ofi_create_plugin:335 NCCL WARN NET/OFI aws-ofi-nccl initialization failed"
    assert analyze_lines([efa, failed]).verdict == "unknown"


def test_every_evidence_kind_is_a_rule_with_its_source() -> None:
    kinds = {e.kind for f in corpus_files() for e in analyze_paths([str(f)]).evidence}
    assert kinds <= set(RULES), kinds - set(RULES)
    assert {"net-channel", "network", "provider", "ib-init", "socket-init", "bootstrap", "efa-wording", "comm"} <= kinds
    for name, rule in RULES.items():
        assert rule.wording and rule.tells, name
        assert "NCCL" in rule.source or "aws-ofi-nccl" in rule.source or "libfabric" in rule.source or "PyTorch" in rule.source, name


# --- machines ------------------------------------------------------------------------------
SOCKET_447 = (DATA / "socket_nccl447_slurm_gcp_selected_two_hosts.log").read_text().splitlines()


def test_same_hostname_with_different_addresses_is_two_nodes() -> None:
    same = [x.replace("slurm-train-compute-0-0", "ubuntu").replace("slurm-train-compute-0-1", "ubuntu") for x in SOCKET_447]
    r = analyze_lines(same)
    assert (r.verdict, r.nodes) == ("socket", 2)
    assert sorted(h.host for h in r.hosts) == ["ubuntu (10.0.0.33)", "ubuntu (10.0.0.34)"]
    assert {h.told_by for h in r.hosts} == {"addresses"} and all(h.machines == 1 for h in r.hosts)
    assert any("2 machines share the hostname 'ubuntu'" in x for x in r.reasons)
    rows = {x.pid: x for x in r.ranks}
    assert (rows[2139].host, rows[2139].ip) == ("ubuntu (10.0.0.34)", "10.0.0.34")
    # Same name and the same address is one machine.
    one = [x.replace("10.0.0.33", "10.0.0.34") for x in same]
    assert analyze_lines(one).nodes == 1


def test_same_hostname_same_pid_different_addresses_is_two_machines() -> None:
    same = [re.sub(r"slurm-train-compute-0-[01]:(?:2139|2119):(\d+) \[\d\]", r"ubuntu:7:\1 [0]", x) for x in SOCKET_447]
    assert sum("ubuntu:7:" in x for x in same) == 12
    r = analyze_lines(same)
    assert r.nodes == 2 and [h.machines for h in r.hosts] == [2]
    assert any("printed 2 different" in w for w in r.hosts[0].why)


def test_the_same_interface_with_two_addresses_is_two_machines_whatever_line_printed_it() -> None:
    r = analyze_paths([str(DATA / "socket_nccltests188_same_hostname_user_ib_disabled.log")])
    assert r.nodes == 2 and {h.host for h in r.hosts if h.machines} == {"user (192.168.1.10)", "user (192.168.1.14)"}
    assert [h.processes for h in r.hosts if not h.machines] == [["user:169129:4"]]  # printed no address: not a third machine


def test_a_communicator_with_several_nodes_is_never_single_node() -> None:
    p2p = (DATA / "singlenode_nccl1538_p2p_cumem_k8s_pod.log").read_text().splitlines()
    assert analyze_lines(p2p).verdict == "single-node"
    host = p2p[0].split(" NCCL ")[0]
    r = analyze_lines([*p2p, f"{host} NCCL INFO comm 0x55d1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0"])
    assert (r.verdict, r.nodes) == ("unknown", 2)
    assert r.hosts[0].machines == 2 and "nNodes 2" in " ".join(r.hosts[0].why)


def test_two_ranks_of_one_communicator_under_one_prefix_are_two_machines() -> None:
    start = "ubuntu:61:61 [0] NCCL INFO ncclCommInitRank comm 0x{ptr} rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x5eed - Init START"
    lines = [start.format(ptr="55a0", rank=0), start.format(ptr="71f0", rank=1),
             "ubuntu:61:70 [0] NCCL INFO Channel 00/0 : 1[1b000] -> 0[1b000] [receive] via NET/Socket/0",
             "ubuntu:61:70 [0] NCCL INFO Channel 00/0 : 0[1b000] -> 1[1b000] [receive] via NET/Socket/0"]
    r = analyze_lines(lines)
    assert (r.verdict, r.proof, r.nodes) == ("socket", "carried", 2)
    assert sorted(x.rank for x in r.ranks) == [0, 1] and all(x.inter_node == "socket" for x in r.ranks)
    assert any(e.kind == "pid-collision" for e in r.evidence)


def test_duplicate_bus_ids_split_machines_unless_nccl_said_duplicate_gpu() -> None:
    start = "node:{pid}:{pid} [0] NCCL INFO ncclCommInitRank comm 0x{pid} rank {rank} nranks 2 cudaDev 0 busId 1b000 commId 0xfeed - Init START"
    lines = [start.format(pid=11, rank=0), start.format(pid=12, rank=1)]
    assert analyze_lines(lines).nodes == 2  # NCCL refuses two ranks on one GPU of one host
    warn = "node:12:12 [0] init.cc:974 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000"
    assert analyze_lines([*lines, warn]).nodes == 1  # ... and says so when it happens
    assert analyze_paths([str(DATA / "unknown_horovod3929_mpi_duplicate_gpu_one_host.log")]).nodes == 1


def test_more_ranks_of_a_communicator_than_local_ranks_is_more_machines() -> None:
    lines = []
    for rank in range(4):
        p = f"box:{100 + rank}:{100 + rank} [{rank % 2}] NCCL INFO "
        lines += [p + f"ncclCommInitRank comm 0x{rank}a rank {rank} nranks 4 cudaDev {rank % 2} busId {rank}000 commId 0xc0ffee - Init START",
                  p + f"comm 0x{rank}a rank {rank} nRanks 4 nNodes 1 localRanks 2 localRank {rank % 2} MNNVL 0"]
    r = analyze_lines(lines)
    assert r.nodes == 2 and "localRanks is 2" in " ".join(r.hosts[0].why)


def test_logs_grouped_per_node_are_judged_per_node(tmp_path: Path) -> None:
    # Two pods whose containers share the hostname and whose logs are the same real excerpt.
    src = DATA / "socket_nccl857_libibverbs_missing_selected_one_host.log"
    r = analyze_node_paths({"pod-a": [str(src)], "pod-b": [str(src)]})
    assert (r.verdict, r.proof, r.nodes) == ("socket", "selected", 2)
    assert [(h.host, h.told_by, h.inter_node, h.proof) for h in r.hosts] == [
        ("pod-a", "caller", "socket", "selected"), ("pod-b", "caller", "socket", "selected")]
    # Lines without NCCL's prefix belong to the machine the caller named.
    bare = tmp_path / "bare.log"
    bare.write_text("NCCL INFO NET/Socket : Using [0]eth0:10.0.0.9<0>\nNCCL INFO Using network Socket\n")
    r = analyze_node_paths({"pod-a": [str(bare)], "pod-b": [str(src)]})
    assert r.nodes == 2 and {h.host for h in r.hosts} == {"pod-a", "pod-b"}


def test_ray_driver_folds_are_counted_on_the_lines_read() -> None:
    r = analyze_paths([str(DATA / "socket_awsome386_ray_driver_same_hostname_two_ips_folded.log")])
    assert (r.verdict, r.proof, r.nodes, r.folded_repeats) == ("socket", "carried", 2, 28)
    assert any("RAY_DEDUP_LOGS" in x for x in r.reasons)
    # A folded line that carries no evidence is not read (a pass for the marker alone costs a
    # quarter of the scan): its fold is not counted.
    assert analyze_paths([str(DATA / "unknown_awsome386_ray_driver_folded_repeats_ring_listing.log")]).folded_repeats == 0


# --- issue 22 item 10: libfabric with the provider unproven; ranks of one node that disagree -------
GDR_CHANNEL = "h1:10:12 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA"


@pytest.mark.parametrize(("proof_line", "kind"), [
    # NCCL src/graph/topo.cc prints the plugin's device name; the kernel's efa driver names devices efa_<k>.
    ("h1:10:10 [0] NCCL INFO NET/Libfabric : GPU Direct RDMA Enabled for HCA 0 'efa_0'", "efa-device"),
    ("h1:10:10 [0] NCCL INFO NET/AWS Libfabric : GPU Direct RDMA Enabled for HCA 3 'efa_3-rdm'", "efa-device"),
    ("h1:10:10 [0] NCCL INFO NET/OFI GUID of efa_1: 0000000c00320000", "efa-device"),
    # aws-ofi-nccl's completion-error warning quotes libfabric's efa message (fi_cq_strerror); the text is from aws-ofi-nccl#346.
    ("h1:10:12 [0] process_completions:1047 NCCL WARN NET/OFI Request 0x7f00 (send) completed with error: err: 5, flags: 0, "
     "prov_errno: 4, strerror: Invalid address My EFA addr: fi_addr_efa://[fe80::13:c2ff:fe6f:f03d]:0:1072483550 My host id: "
     "i-0db7083f3fcbebb65, len: 0", "efa-address"),
])
def test_a_line_that_proves_the_efa_provider_makes_libfabric_efa(proof_line: str, kind: str) -> None:
    r = analyze_lines([proof_line, GDR_CHANNEL])
    assert (r.verdict, r.proof, r.provider) == ("efa", "carried", "efa"), r.reasons
    assert any(e.kind == kind for e in r.evidence)
    assert any(("fi_addr_efa" if kind == "efa-address" else "efa_<k>") in x for x in r.reasons)


def test_a_renamed_or_other_device_proves_nothing() -> None:
    for dev in ("rdmap16s27", "mlx5_0", "cxi0"):
        r = analyze_lines([f"h1:10:10 [0] NCCL INFO NET/Libfabric : GPU Direct RDMA Enabled for HCA 0 '{dev}'", GDR_CHANNEL])
        assert (r.verdict, r.provider) == ("libfabric", None), dev


def test_libfabric_verdict_says_what_to_do_and_fails_expect_efa(capsys: pytest.CaptureFixture[str]) -> None:
    f = str(DATA / "libfabric_nccl1597_gdrdma_no_provider_one_host.log")
    r = analyze_paths([f])
    assert (r.verdict, r.proof, r.provider, r.gdr) == ("libfabric", "carried", None, True)
    assert any("Selected provider is" in c and "FI_PROVIDER=efa" in c for c in r.causes)
    assert main(["nccl", f, "--expect", "efa"]) == 3
    out = capsys.readouterr().out
    assert "verdict: libfabric, carried" in out and "provider unproven" in out
    assert "expected efa: no (the log shows libfabric with the provider unproven" in out


def test_ranks_that_only_selected_count_where_their_machine_carried() -> None:
    # Rank 1 of host a went to sockets (aws-ofi-nccl failed there) while rank 0 of the same host carried EFA.
    lines = ["a:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)",
             "a:1:2 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA",
             "a:2:2 [1] NCCL INFO NET/IB : No device found.",
             "a:2:2 [1] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>"]
    r = analyze_lines(lines)
    assert (r.verdict, r.proof) == ("mixed", "selected")
    [h] = r.hosts
    assert (h.inter_node, h.inter_node_ranks) == ("mixed", {"efa": ["a:1:0"], "socket": ["a:2:1"]})  # no comm lines: no rank numbers
    assert "a: ranks of one machine on different transports — efa: a:1:0; socket: a:2:1" in r.reasons
    # The same selection on another machine, with no traffic there, is not counted against this one.
    other = [x.replace("a:2:2 [1]", "b:2:2 [1]").replace("10.0.0.5", "10.0.0.6") for x in lines]
    assert analyze_lines(other).verdict == "efa"


def test_one_node_with_ranks_on_two_transports_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    d = DATA / "mixed_composed_one_node_efa_and_socket_ranks"
    r = analyze_node_paths({"node-a": [str(d / "node-a")]})
    [h] = r.hosts
    assert (h.host, h.inter_node) == ("node-a", "mixed")
    assert h.inter_node_ranks["socket"] == ["ip-172-31-21-100:18571:1@node-a"] and len(h.inter_node_ranks["efa"]) >= 2
    assert any(x.startswith("node-a: ranks of one machine on different transports — efa:") for x in r.reasons)
    assert r.fallback and r.fallback_from == "efa"
