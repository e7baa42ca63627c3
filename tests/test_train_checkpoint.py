"""Checkpoints: a real DCP save/load in a one-rank gloo group, and refusal of partial or corrupt dirs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from raydlc.errors import CheckpointError
from raydlc.facts.models import ModelSpec
from raydlc.train import checkpoint as C
from raydlc.train.model import apply_fsdp, build_model

SMALL = ModelSpec("t", 32, 2, 2, 1, 64, 128, True, max_position_embeddings=64)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = apply_fsdp(build_model(SMALL, seed=seed))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, SMALL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def saved(group: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    model, opt = trained(seed=1)
    d = tmp_path_factory.mktemp("ck") / C.dir_name(7)
    C.save(d, model, opt, step=7, rank=0, world_size=1, extra={"history": [{"step": 7, "loss": 1.5}]}, meta={"model": "t"})
    return d, full(model)


def test_save_writes_shards_extras_and_a_manifest_of_all_files(saved: tuple[Path, dict]) -> None:
    d, _ = saved
    m = C.verify(d)
    assert m.step == 7 and m.world_size == 1 and m.meta["model"] == "t"
    assert set(m.files) == {p.name for p in d.iterdir()} - {C.MANIFEST}
    assert {".metadata", "extra_rank0.pt"} <= set(m.files)


def test_load_restores_model_optimizer_step_and_rng(saved: tuple[Path, dict]) -> None:
    d, weights = saved
    model, opt = trained(seed=2)
    assert any(not torch.equal(weights[k], v) for k, v in full(model).items())
    torch.manual_seed(1234)
    extra = C.load(d, model, opt, rank=0)
    assert extra["step"] == 7 and extra["history"] == [{"step": 7, "loss": 1.5}]
    assert all(torch.equal(weights[k], v) for k, v in full(model).items())
    assert opt.state and all(int(s["step"]) == 1 for s in opt.state.values())
    C.set_rng_state(extra["rng"])  # the saved state, not the 1234 one


def test_every_rank_restores_the_history_rank_0_stored_once(saved: tuple[Path, dict], tmp_path: Path) -> None:
    d = Path(shutil.copytree(saved[0], tmp_path / saved[0].name))
    torch.save({"step": 7, "rank": 1, "rng": C.rng_state()}, d / "extra_rank1.pt")  # a rank > 0 writes no history
    model, opt = trained(seed=2)
    extra = C.load(d, model, opt, rank=1)
    assert extra["rank"] == 1 and extra["history"] == [{"step": 7, "loss": 1.5}]
    torch.save({"step": 6, "rank": 1, "rng": C.rng_state()}, d / "extra_rank1.pt")
    with pytest.raises(CheckpointError, match=r"extra_rank1\.pt is for step 6"):
        C.load(d, model, opt, rank=1)


def corrupt_copies(src: Path, root: Path) -> dict[str, Path]:
    cases: dict[str, Path] = {}

    def copy(name: str) -> Path:
        d = root / name / src.name
        shutil.copytree(src, d)
        cases[name] = d
        return d

    (copy("no-manifest") / C.MANIFEST).unlink()
    (copy("missing-shard") / "__0_0.distcp").unlink()
    shard = copy("truncated") / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    shard = copy("flipped-byte") / "__0_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    (copy("bad-manifest") / C.MANIFEST).write_text("{not json")
    m = copy("wrong-format") / C.MANIFEST
    m.write_text(json.dumps({**json.loads(m.read_text()), "format": 99}))
    return cases


EXPECT = {
    "no-manifest": "partial",
    "missing-shard": "__0_0.distcp is missing",
    "truncated": "corrupt",
    "flipped-byte": "SHA-256",
    "bad-manifest": "unreadable manifest",
    "wrong-format": "format",
}


def test_partial_or_corrupt_checkpoints_are_refused_before_anything_loads(saved: tuple[Path, dict], tmp_path: Path) -> None:
    d, _weights = saved
    model, opt = trained(seed=3)
    before = full(model)
    for name, path in corrupt_copies(d, tmp_path).items():
        with pytest.raises(CheckpointError, match=EXPECT[name]):
            C.load(path, model, opt, rank=0)
        assert all(torch.equal(before[k], v) for k, v in full(model).items()), f"{name}: weights changed"
    with pytest.raises(CheckpointError, match="does not exist"):
        C.verify(tmp_path / "nowhere")


def test_candidates_are_the_newest_runs_checkpoints_highest_step_first(tmp_path: Path) -> None:
    assert C.candidates(tmp_path) == []
    for run, steps in (("run-20260101-000000-000001", [2, 4]), ("run-20260102-000000-000001", [3, 10, 1])):
        for s in steps:
            (tmp_path / run / C.dir_name(s)).mkdir(parents=True)
    (tmp_path / "run-20260103-000000-000001").mkdir()  # a run that never checkpointed
    (tmp_path / "run-20260102-000000-000001" / "checkpoint_manager_snapshot.json").write_text("{}")  # Ray Train's, beside them
    assert C.candidates(tmp_path) == [str(tmp_path / "run-20260102-000000-000001" / C.dir_name(s)) for s in (10, 3, 1)]


def started(run: Path, at: float) -> None:
    """The record raydlc writes at a run's start (train.runfolder)."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "raydlc_run.json").write_text(json.dumps({"run_name": run.name, "started_at": at}))


def test_resume_takes_the_newest_run_by_its_recorded_start_not_by_name(saved: tuple[Path, dict], tmp_path: Path) -> None:
    """A day-old run named `zebra` sorts after `run-2026…` by name; --resume continues the run just made."""
    import time

    zebra, fresh = tmp_path / "zebra", tmp_path / "run-20260101-000000-000001"
    shutil.copytree(saved[0], zebra / C.dir_name(2))
    shutil.copytree(saved[0], fresh / C.dir_name(4))
    started(zebra, time.time() - 86_400)
    started(fresh, time.time())
    assert C.newest_run(str(tmp_path)) == fresh.name
    assert C.newest_intact(tmp_path).path == str(fresh / C.dir_name(4))
    assert C.newest_intact(tmp_path, run="zebra").path == str(zebra / C.dir_name(2))  # --run-name zebra --resume: that run


class _Touch:
    """A pickle payload: unpickled, it creates a file (what a hostile checkpoint would run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))


def _foreign(saved: Path, into: Path, name: str, payload: bytes) -> Path:
    """A copy of a real checkpoint with `name` replaced by `payload`, its manifest made to agree (size, SHA-256)."""
    import hashlib

    d = Path(shutil.copytree(saved, into))
    (d / name).write_bytes(payload)
    doc = json.loads((d / C.MANIFEST).read_text())
    doc["files"][name] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    (d / C.MANIFEST).write_text(json.dumps(doc))
    return d


def test_a_checkpoint_carrying_a_pickle_runs_nothing(saved: tuple[Path, dict], tmp_path: Path) -> None:
    """Extras and DCP's .metadata behind an agreeing manifest: refused before anything unpickles them; the file never appears."""
    import io
    import pickle
    import re

    model, opt = trained(seed=3)
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"step": 7, "rank": 0, "rng": _Touch(marker)}, buf)
    for name, payload in (("extra_rank0.pt", buf.getvalue()), (".metadata", pickle.dumps(_Touch(marker)))):
        d = _foreign(saved[0], tmp_path / f"foreign{name.replace('.', '-')}", name, payload)
        with pytest.raises(CheckpointError, match=f"{re.escape(name)}.*never code"):
            C.verify(d)  # the driver, before Ray starts
        with pytest.raises(CheckpointError, match="never code"):
            C.load(d, model, opt, rank=0)  # a worker
        assert not marker.exists(), name


def test_a_manifest_listing_files_raydlc_never_writes_is_refused(saved: tuple[Path, dict], tmp_path: Path) -> None:
    d = _foreign(saved[0], tmp_path / "other", "model.pkl", b"anything")
    with pytest.raises(CheckpointError, match=r"not written by raydlc: its manifest lists model\.pkl"):
        C.verify(d)


def test_every_torch_load_in_the_package_reads_data_only() -> None:
    """No `torch.load` without weights_only=True, no bare pickle.load, anywhere in src/."""
    import re

    src = Path(C.__file__).parents[1]
    for f in src.rglob("*.py"):
        text = f.read_text()
        for m in re.finditer(r"torch\.load\(([^)]*)\)", text):
            assert "weights_only=True" in m.group(1), f"{f}: {m.group(0)}"
        assert not re.search(r"\bpickle\.loads?\(", text), f


def test_resume_passes_over_a_save_cut_short_and_refuses_when_none_is_whole(saved: tuple[Path, dict], tmp_path: Path) -> None:
    """Ray uploads a checkpoint's files in no set order: a Ctrl-C mid-upload leaves the manifest beside a short shard."""
    run = tmp_path / "out" / "run-20260101-000000-000001"
    whole = Path(shutil.copytree(saved[0], run / C.dir_name(2)))
    cut = Path(shutil.copytree(saved[0], run / C.dir_name(4)))
    shard = cut / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (run / C.dir_name(6)).mkdir()  # no manifest: still arriving, or abandoned
    found = C.newest_intact(tmp_path / "out")
    assert found is not None and found.path == str(whole) and found.manifest.step == 7
    assert len(found.skipped) == 2 and "no raydlc_checkpoint.json" in found.skipped[0] and "__0_0.distcp has" in found.skipped[1]
    assert C.candidates(tmp_path / "out")[0] == str(run / C.dir_name(6))  # by name alone: what must not be trusted
    flipped = whole / "__0_0.distcp"
    raw = bytearray(flipped.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    assert C.newest_intact(tmp_path / "out", hashes=False).path == str(whole)  # sizes only: a cut, not a flipped byte
    older = tmp_path / "out" / "run-20200101-000000-000001"
    shutil.copytree(saved[0], older / C.dir_name(9))  # an older run, whole
    started(run, 2000.0)
    started(older, 1000.0)  # runs are ordered by their recorded start, not by when their folders changed
    with pytest.raises(CheckpointError, match=r"no raydlc_checkpoint\.json"):  # none of the newest run's whole: its newest one's reason
        C.newest_intact(tmp_path / "out")
    assert C.newest_intact(tmp_path / "empty") is None


def test_resume_from_a_uri_passes_over_a_checkpoint_whose_upload_did_not_finish(saved: tuple[Path, dict], tmp_path: Path) -> None:
    """Remote storage is checked by manifest and sizes through pyarrow (file:// stands in for s3://)."""
    run = tmp_path / "store" / "run-20260101-000000-000001"
    shutil.copytree(saved[0], run / C.dir_name(2))
    (Path(shutil.copytree(saved[0], run / C.dir_name(4))) / "__0_0.distcp").unlink()  # S3 objects arrive whole, one by one
    uri = f"file://{tmp_path / 'store'}"
    found = C.newest_intact(uri)
    assert found is not None and found.path == f"{uri}/run-20260101-000000-000001/{C.dir_name(2)}"
    assert found.skipped == (f"checkpoint {uri}/run-20260101-000000-000001/{C.dir_name(4)} is partial: __0_0.distcp is missing",)


def test_check_resumes_from_the_newest_whole_checkpoint_and_says_what_it_passed_over(saved: tuple[Path, dict], tmp_path: Path) -> None:
    from raydlc.config import FIELDS, LOCAL_DEFAULTS, TrainConfig
    from raydlc.train.prepare import check

    local = TrainConfig().updated(**{FIELDS[k].key: v for k, v in LOCAL_DEFAULTS.items()})
    run = tmp_path / "run-20260101-000000-000001"
    whole = Path(shutil.copytree(saved[0], run / C.dir_name(2)))
    (Path(shutil.copytree(saved[0], run / C.dir_name(4))) / "extra_rank0.pt").unlink()
    c = check(local.updated(resume=True, storage_path=str(tmp_path)))
    assert c.resume_from == str(whole) and c.manifest is not None and c.manifest.step == 7
    assert c.skipped == (f"--resume passes over checkpoint {run / C.dir_name(4)} is partial: extra_rank0.pt is missing",)
    with pytest.raises(CheckpointError, match=r"extra_rank0\.pt is missing"):  # one named checkpoint: refused, never replaced
        check(local.updated(resume_from=str(run / C.dir_name(4)), storage_path=str(tmp_path)))


# ---- asynchronous saves ----------------------------------------------------------------------------


def test_an_async_save_holds_the_weights_of_its_start_while_training_goes_on(group: None, tmp_path: Path) -> None:
    """`start` returns once the shards are staged in host memory: steps taken while DCP writes change
    nothing in the checkpoint; `seal` after the write gives a checkpoint `verify` and `load` accept."""
    model, opt = trained(seed=4)
    at_save = full(model)
    ckpt_group = dist.new_group(backend="gloo")
    d = tmp_path / C.dir_name(3)
    digests = C.start(d, model, opt, step=3, rank=0, extra={"history": []}, group=ckpt_group)
    x = torch.randint(0, SMALL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(9))
    model(input_ids=x, labels=x).loss.backward()  # training goes on meanwhile
    opt.step()
    assert any(not torch.equal(at_save[k], v) for k, v in full(model).items())
    mine = digests.result(timeout=120)
    assert set(mine) == {p.name for p in d.iterdir()} and ".metadata" in mine  # hashed in the thread, after the write
    assert not (d / C.MANIFEST).exists()  # partial until sealed
    C.seal(d, mine, step=3, rank=0, world_size=1, meta={"model": "t"})
    assert C.verify(d).step == 3
    other, other_opt = trained(seed=5)
    assert C.load(d, other, other_opt, rank=0)["step"] == 3
    assert all(torch.equal(at_save[k], v) for k, v in full(other).items())


def test_a_run_s_cached_stager_reuses_its_host_copy_and_each_save_holds_its_own_steps_weights(group: None, tmp_path: Path) -> None:
    """Issue 46: the run's stager keeps one host copy across saves (no fresh allocation per save); the second save
    copies the new weights into it, and the first checkpoint, written before, keeps the weights of its own step."""
    model, opt = trained(seed=6)
    ckpt_group, staging = dist.new_group(backend="gloo"), C.stager(cuda=False)
    saved_at: dict[int, dict[str, torch.Tensor]] = {}
    for step in (1, 2):
        saved_at[step] = full(model)
        d = tmp_path / C.dir_name(step)
        C.seal(d, C.start(d, model, opt, step=step, rank=0, extra={}, group=ckpt_group, staging=staging).result(timeout=120),
               step=step, rank=0, world_size=1, meta={})
        if step == 1:
            cached = {id(v) for v in staging._state_dict_stager._cached_storage_mapping.values()}
            assert cached  # the host copy the next save reuses
            x = torch.randint(0, SMALL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(11))
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
    assert {id(v) for v in staging._state_dict_stager._cached_storage_mapping.values()} == cached  # the same buffers, refilled
    assert any(not torch.equal(saved_at[1][k], saved_at[2][k]) for k in saved_at[1])
    for step in (1, 2):
        other, other_opt = trained(seed=5)
        C.load(tmp_path / C.dir_name(step), other, other_opt, rank=0)
        assert all(torch.equal(saved_at[step][k], v) for k, v in full(other).items())


def test_prune_keeps_the_newest_complete_checkpoints_and_any_still_arriving(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        (tmp_path / C.dir_name(step)).mkdir()
        if step != 8:
            (tmp_path / C.dir_name(step) / C.MANIFEST).write_text("{}")
    (tmp_path / "export").mkdir()
    deleted = C.prune(tmp_path, keep=2)
    assert [p.name for p in deleted] == [C.dir_name(2)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [C.dir_name(4), C.dir_name(6), C.dir_name(8), "export"]
    assert C.prune(tmp_path, keep=0) == [] and len(list(tmp_path.iterdir())) == 4  # 0 keeps all


def test_a_garbled_shard_behind_an_agreeing_manifest_is_raydlcs_line_naming_checkpoint_and_shards(
        saved: tuple[Path, dict], tmp_path: Path) -> None:
    """Sizes and SHA-256s rewritten to match a shard whose bytes were zeroed: DCP's torch.load fails in the worker,
    and the error is raydlc's, naming the checkpoint and its shard files (issue 44)."""
    d, _weights = saved
    copy = tmp_path / d.name
    shutil.copytree(d, copy)
    shard = next(p for p in copy.iterdir() if p.name.endswith(".distcp"))
    raw = bytearray(shard.read_bytes())
    raw[:64] = bytes(64)
    shard.write_bytes(bytes(raw))
    manifest = json.loads((copy / C.MANIFEST).read_text())
    manifest["files"] = C.file_digests(copy)
    (copy / C.MANIFEST).write_text(json.dumps(manifest))
    C.verify(copy)  # the manifest agrees: only reading the shard tells
    model, opt = trained(seed=4)
    with pytest.raises(CheckpointError, match=rf"checkpoint {copy}: .* in its shards is not plain data \(UnpicklingError\)") as e:
        C.load(copy, model, opt, rank=0)  # the first item read is a pickled one (DCP would torch.load it weights_only=False)
    assert "\n" not in e.value.message and len(e.value.message) < 700
