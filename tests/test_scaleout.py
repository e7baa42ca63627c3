from __future__ import annotations

import json
from pathlib import Path

import pytest

from raydlc import planner
from raydlc.cli import main
from raydlc.errors import InputError
from raydlc.facts import instances
from raydlc.facts.models import get_spec
from raydlc.planner import scan

W = planner.Workload

COUNTS = [1, 2, 4, 8, 16, 32, 64]


def at(instance_type: str, gpus: int):
    return lambda n: planner.layout_for(n, gpus, instance_type=instance_type)


@pytest.mark.parametrize(("text", "want"), [("1,2,4", [1, 2, 4]), ("8, 2,2 ,1", [1, 2, 8]), ("450", [450])])
def test_node_counts_are_sorted_whole_numbers_without_repeats(text: str, want: list[int]) -> None:
    assert scan.parse_node_counts(text) == want


@pytest.mark.parametrize(("text", "says"), [
    ("", "comma-separated"), ("1,,2", "comma-separated"), ("0", "outside 1..450"), ("451", "outside 1..450"),
    ("two", "not a node count"), ("1.5", "not a node count"), ("-1", "not a node count"), ("١", "not a node count"),
    (",".join(str(i) for i in range(1, 34)), "at most 32"),
])
def test_bad_node_counts_are_refused_by_name(text: str, says: str) -> None:
    with pytest.raises(InputError, match=says):
        scan.parse_node_counts(text)


def test_each_row_is_the_planners_recommendation_at_that_node_count() -> None:
    spec = get_spec("qwen2.5-72b")
    s = scan.scan(W(spec), COUNTS, at("p5.48xlarge", 8))
    assert [r.nodes for r in s.rows] == COUNTS and [r.gpus for r in s.rows] == [8 * n for n in COUNTS]
    assert s.nvlink and s.efa and s.network_gbps == 3200 and s.gpu == "h100"
    for r in s.rows:
        layout = planner.layout_for(r.nodes, 8, instance_type="p5.48xlarge")
        best = {ac: planner.recommend(W(spec, activation_checkpointing=ac), layout).best for ac in planner.AC_SEARCH}
        if not r.fits:
            assert all(b is None for b in best.values())
            continue
        chosen = best[r.activation_checkpointing]
        assert chosen is not None
        assert (r.strategy, r.micro_batch, r.grad_accum, r.sync, r.tokens_per_s) == (
            chosen.strategy, chosen.micro_batch, chosen.grad_accum, chosen.sync, chosen.tokens_per_s)
        fastest = max(c.tokens_per_s for c in best.values() if c is not None)
        assert r.tokens_per_s >= fastest / (1 + planner.DEFAULT_ASSUMPTIONS.tie_fraction) - 1e-6
        assert r.per_gpu_bytes is not None and r.per_gpu_bytes <= planner.gpu_capacity(layout)
        assert r.tokens_per_step == r.global_batch * s.seq_len <= planner.DEFAULT_MAX_GLOBAL_BATCH or r.global_batch == r.gpus
    # 72B in bf16-mixed needs ~16 bytes per parameter: one or two nodes of 8 x 80 GB cannot hold it
    assert [r.fits for r in s.rows[:2]] == [False, False] and s.reference_nodes == 4


def test_efficiency_is_tokens_per_s_against_linear_from_the_first_count_that_fits() -> None:
    s = scan.scan(W(get_spec("qwen2.5-1.5b")), COUNTS, at("g6.12xlarge", 4))
    ref = s.rows[0]
    assert s.reference_nodes == 1 and ref.efficiency == pytest.approx(1.0)
    for r in s.rows:
        assert r.linear_tokens_per_s == pytest.approx(ref.tokens_per_s * r.nodes)
        assert r.efficiency == pytest.approx(r.tokens_per_s / (ref.tokens_per_s * r.nodes))
    # with the global batch capped, more nodes past the cap cannot keep scaling over a 40 Gb/s link
    assert s.rows[-1].efficiency < 0.5
    best = s.best_efficient()
    assert best is not None and best.efficiency >= 0.8
    assert all(r.efficiency < 0.8 for r in s.rows if r.nodes > best.nodes)


def test_pinned_activation_checkpointing_is_honoured() -> None:
    spec = get_spec("qwen2.5-7b")
    on = scan.scan(W(spec), [2, 4], at("p4de.24xlarge", 8), activation_checkpointing=True)
    off = scan.scan(W(spec), [2, 4], at("p4de.24xlarge", 8), activation_checkpointing=False)
    assert all(r.activation_checkpointing for r in on.rows if r.fits)
    assert not any(r.activation_checkpointing for r in off.rows)


def test_the_instance_types_facts_decide_the_links() -> None:
    g6 = scan.scan(W(get_spec("qwen2.5-7b")), [2], at("g6e.48xlarge", 8))
    p5 = scan.scan(W(get_spec("qwen2.5-7b")), [2], at("p5.48xlarge", 8))
    g6e, p5t = instances.INSTANCE_TYPES["g6e.48xlarge"], instances.INSTANCE_TYPES["p5.48xlarge"]
    assert (g6.nvlink, g6.network_gbps, g6.gpu) == (g6e.nvlink, g6e.network_gbps, g6e.gpu) == (False, 400, "l40s")
    assert (p5.nvlink, p5.network_gbps, p5.gpu) == (p5t.nvlink, p5t.network_gbps, p5t.gpu) == (True, 3200, "h100")
    assert p5.rows[0].tokens_per_s > g6.rows[0].tokens_per_s


def test_a_gpu_what_if_takes_the_network_of_a_type_with_that_gpu() -> None:
    layout = planner.layout_for(16, 8, gpu="h100", instance_type="g6.12xlarge")
    assert (layout.instance_type, layout.network_gbps, layout.nvlink) == ("p5.48xlarge", 3200, True)
    with pytest.raises(InputError, match="no instance type in the catalogue has B200"):
        planner.layout_for(2, 8, gpu="b200", instance_type="g6.12xlarge")
    assert planner.layout_for(2, 8, gpu="b200", instance_type="g6.12xlarge", network_gbps=3200).network_gbps == 3200


def test_seq_len_beyond_positions_and_unknown_policy_are_refused() -> None:
    spec = get_spec("qwen2.5-0.5b")
    with pytest.raises(InputError, match="positions"):
        scan.scan(W(spec, seq_len=spec.max_position_embeddings + 1), [1], at("g6.12xlarge", 4))
    with pytest.raises(InputError, match="precision"):
        scan.scan(W(spec, policy="int4"), [1], at("g6.12xlarge", 4))


def test_plan_scan_nodes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "new" / "scan.png"
    argv = ["plan", "--model", "qwen2.5-72b", "--instance-type", "p5.48xlarge", "--scan-nodes", "1,2,4,8,16,32,64",
            "--plot", str(png), "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["instance_type"], doc["gpus_per_node"], doc["gpu"]) == ("p5.48xlarge", 8, "h100")
    assert [r["nodes"] for r in doc["rows"]] == COUNTS and doc["reference_nodes"] == 4 and doc["plot"] == str(png)
    assert all({"efficiency", "tokens_per_s", "strategy", "micro_batch", "grad_accum", "activation_checkpointing", "per_gpu_bytes"} <= r.keys()
               for r in doc["rows"])
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert [p.name for p in png.parent.iterdir()] == ["scan.png"]  # no temporary left beside it


def test_plan_scan_nodes_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "qwen2.5-1.5b", "--scan-nodes", "1,2,4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "scale-out (predicted)" in out and "on g6.12xlarge: 4 x L4" in out and "40 Gb/s EFA" in out
    cells = [c.strip() for c in out.split("│")]
    assert "100%" in cells and "fsdp" in cells


@pytest.mark.parametrize(("argv", "says"), [
    (["--plot", "x.png"], "--plot draws a scale-out scan"),
    (["--scan-nodes", "0,2"], "outside 1..450"),
    (["--scan-nodes", "1,2", "--plot", "."], "is a directory"),
    (["--scan-nodes", "1", "--instance-type", "p9.huge"], "instance type 'p9.huge' has no known GPU"),
])
def test_plan_scan_bad_input(argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plan", *argv]) == 2
    assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
