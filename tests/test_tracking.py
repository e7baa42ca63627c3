"""The trackers (train.tracking) against the real readers: TensorBoard's EventAccumulator, a real `mlflow
server` (sqlite) read back with MlflowClient, W&B's offline run directory read with wandb's own DataStore.
No Ray: the component is driven as the loop drives it (records at the read cadence, a restart as a second
attempt opened at its checkpoint's step with the restored history)."""

from __future__ import annotations

import http.server
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.test_train_cadence import Hooks, Session, Stop, loop, one_worker
from tests.test_train_step import world_of_one

from raydlc.train.tracking import MLflow, TensorBoard, Tracking, TrackingRun, WandB, scalars_of

STEP_KEYS = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/step_time_s", "train/peak_mem_mb",
             "train/skipped", "train/skipped_steps"}


def record(step: int, *, skipped: bool = False) -> dict:
    return {"step": step, "loss": 3.0 / step, "lr": 1e-3 * min(1, step / 3), "grad_norm": 0.5 + step, "tokens": 64,
            "step_time_s": 0.1, "time": 1000.0 + step, "tokens_per_s": 640.0, "peak_mem_mb": 100.0 + step,
            "peak_reserved_mb": None, "data": "x", "skipped": skipped}


def attempt(trackers: list, steps: range, *, start: int = 0, history: list | None = None, evals: tuple[int, ...] = ()) -> Tracking:
    """One attempt of the loop: open at `start` with the restored history, then read every step (a CPU's cadence)."""
    warnings: list[str] = []
    t = Tracking(trackers, on_warning=warnings.append)
    t.warnings = warnings  # type: ignore[attr-defined]
    t.start(start_step=start, history=history or [], params={"config/LEARNING_RATE": 1e-3, "model": "tiny", "plan/mesh": "[2]"},
            restarted=start > 0)
    for s in steps:
        t.records([record(s)] + ([{"step": s, "eval_loss": 2.0 + 1 / s}] if s in evals else []))
        if s % 3 == 0:
            t.checkpoint(s)
    return t


def where(tmp_path: Path, tid: str = "job0123") -> TrackingRun:
    return TrackingRun(tid, "run-a", str(tmp_path / "run-a" / "tb"), str(tmp_path / "run-a" / "wandb"))


def test_scalars_of_a_step_and_an_eval() -> None:
    v = scalars_of(record(4, skipped=True), skipped_so_far=2, mfu_per_token_s=1e-3)
    assert set(v) >= STEP_KEYS and v["train/skipped"] == 1.0 and v["train/skipped_steps"] == 3.0 and v["train/mfu"] == pytest.approx(0.64)
    e = scalars_of({"step": 4, "eval_loss": 1.5})
    assert e == {"eval/loss": 1.5, "eval/perplexity": pytest.approx(math.exp(1.5))}


# ---- TensorBoard -------------------------------------------------------------------------------


def accumulated(tb: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_every_scalar_at_every_step_and_hparams(tmp_path: Path) -> None:
    w = where(tmp_path)
    t = attempt([TensorBoard(w)], range(1, 9), evals=(4, 8))
    assert t.close() == {} and t.warnings == []  # type: ignore[attr-defined]
    acc = accumulated(Path(w.tb_dir))
    tags = set(acc.Tags()["scalars"])
    assert STEP_KEYS | {"eval/loss", "eval/perplexity", "events/checkpoint_saved"} <= tags
    for k in STEP_KEYS:
        assert [e.step for e in acc.Scalars(k)] == list(range(1, 9)), k
    assert [e.step for e in acc.Scalars("eval/loss")] == [4, 8]
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([3.0 / s for s in range(1, 9)])
    assert [e.step for e in acc.Scalars("events/checkpoint_saved")] == [3, 6]
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")  # the hparams plugin's summary
    from tensorboard.plugins.hparams import plugin_data_pb2

    info = plugin_data_pb2.HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    assert info.session_start_info.hparams["model"].string_value == "tiny"


def test_tensorboard_restart_drops_what_the_failed_attempt_wrote_after_its_checkpoint(tmp_path: Path) -> None:
    """Attempt 1 reads steps 1-7 and dies after its checkpoint of step 6... of step 5 here; attempt 2 continues
    from 5: TensorBoard (purge_step) shows every step once, the second attempt's values from 6 on."""
    w = where(tmp_path)
    attempt([TensorBoard(w)], range(1, 8)).close()
    time.sleep(1.1)  # a second event file: tensorboardX names them by the second
    history = [record(s) for s in range(1, 6)]
    t = attempt([TensorBoard(w)], range(6, 11), start=5, history=history)
    t.close()
    acc = accumulated(Path(w.tb_dir))
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 11))
    assert [e.step for e in acc.Scalars("events/restart")] == [5]


def test_tensorboard_unwritable_storage_is_one_warning(tmp_path: Path) -> None:
    (tmp_path / "run-a").write_text("a file where the run directory should be")
    t = attempt([TensorBoard(where(tmp_path))], range(1, 4))
    assert set(t.close()["trackers_stopped"]) == {"tensorboard"}
    assert len(t.warnings) == 1 and "tracker tensorboard stopped" in t.warnings[0]  # type: ignore[attr-defined]


def test_tensorboard_on_s3_is_copied_up_through_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run on s3://: the events are written locally and copied up (raydlc.edges.storage, pyarrow) at the end;
    read back from the bucket (a real moto server), every step is there."""
    sys.path.insert(0, str(Path(__file__).parent / "doubles"))
    import boto3
    from servers import fresh_moto, moto_server  # type: ignore[import-not-found]

    from raydlc.edges.storage import download

    for k, v in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                 "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(k, v)
    with moto_server() as url, fresh_moto(url) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="runs")
        w = TrackingRun("s3job", "run-a", "s3://runs/team/run-a/tb", str(tmp_path / "wandb"))
        t = attempt([TensorBoard(w)], range(1, 6))
        assert t.close() == {}, t.warnings  # type: ignore[attr-defined]
        back = download("s3://runs/team/run-a/tb", tmp_path / "back")
    assert [e.step for e in accumulated(back).Scalars("train/loss")] == [1, 2, 3, 4, 5]


# ---- MLflow: a real server ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    exe = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [str(exe), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=(root / "server.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield uri
    os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers, by the PID we started
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_mlflow_params_metrics_per_step_artifacts_and_a_restart_is_the_same_run(mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    w = where(tmp_path, "job-mlflow-1")
    first = attempt([MLflow(w, mlflow_server, "raydlc-test")], range(1, 8), evals=(4,))  # dies after step 7; checkpoint at 6
    assert first.close() == {}
    history = [record(s) for s in range(1, 7)] + [{"step": 4, "eval_loss": 2.25}]
    second = Tracking([m := MLflow(w, mlflow_server, "raydlc-test")], on_warning=pytest.fail)
    second.start(start_step=6, history=history, params={"config/LEARNING_RATE": 1e-3, "config/STEPS": 12}, restarted=True)
    second.records([record(s) for s in range(7, 13)] + [{"step": 12, "eval_loss": 1.9}])
    art = tmp_path / "summary.json"
    art.write_text('{"final_loss": 0.25}')
    second._submit(lambda: m.artifact(art))
    assert second.close(finished=True) == {}

    c = MlflowClient(mlflow_server)
    exp = c.get_experiment_by_name("raydlc-test")
    runs = c.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == m.run_id and runs[0].info.status == "FINISHED"
    run = c.get_run(m.run_id)
    assert run.data.params["config/LEARNING_RATE"] == "0.001" and run.data.params["config/STEPS"] == "12"
    assert run.data.tags["raydlc.tracking_id"] == "job-mlflow-1"
    for key in STEP_KEYS:
        steps = sorted(x.step for x in c.get_metric_history(m.run_id, key))
        assert steps == list(range(1, 13)), key  # contiguous, none twice
    assert sorted(x.step for x in c.get_metric_history(m.run_id, "eval/loss")) == [4, 12]
    assert [x.step for x in c.get_metric_history(m.run_id, "events/restart")] == [6]
    assert "summary.json" in [f.path for f in c.list_artifacts(m.run_id)]


class _Answer(http.server.BaseHTTPRequestHandler):
    code = 500

    def _answer(self) -> None:
        body = b'{"error_code": "INTERNAL_ERROR", "message": "broken"}'
        self.send_response(self.code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture(params=["closed port", "500", "bad credentials"])
def broken_uri(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    if request.param == "closed port":
        yield f"http://127.0.0.1:{free_port()}"
        return
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "not-a-valid-token")
    handler = type("H", (_Answer,), {"code": 500 if request.param == "500" else 401})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_failing_mlflow_is_one_warning_and_the_other_trackers_go_on(broken_uri: str, tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    w = where(tmp_path)
    t = attempt([MLflow(w, broken_uri, "x"), TensorBoard(w)], range(1, 6))
    out = t.close(timeout=60)
    assert list(out["trackers_stopped"]) == ["mlflow"]
    assert len(t.warnings) == 1 and t.warnings[0].startswith("tracker mlflow stopped")  # type: ignore[attr-defined]
    assert "not-a-valid-token" not in t.warnings[0]  # type: ignore[attr-defined]
    assert [e.step for e in accumulated(Path(w.tb_dir)).Scalars("train/loss")] == [1, 2, 3, 4, 5]


def test_the_loop_never_waits_for_a_tracker(tmp_path: Path) -> None:
    """The loop's calls only enqueue: with its tracker blocked, a whole attempt's calls still return."""
    from raydlc.train.tracking import Backend

    release = threading.Event()

    class Blocked(Backend):
        name = "blocked"

        def __init__(self) -> None:
            self.seen: list[int] = []

        def open(self, *, start_step: int) -> int:
            assert release.wait(60)
            return start_step

        def scalars(self, step: int, values: dict) -> None:
            if "train/loss" in values:
                self.seen.append(step)

    b = Blocked()
    t = attempt([b], range(1, 11))  # returns while the tracker is still blocked in open
    assert b.seen == []
    release.set()
    t.close()
    assert b.seen == list(range(1, 11))


# ---- the loop feeds them; a restart continues the run ------------------------------------------


class Keeping(Session):
    """Ray Train's part for a worker of one across attempts: the reported checkpoints kept, the newest restored."""

    def __init__(self, kept: Path, restore: Path | None = None) -> None:
        super().__init__()
        self.kept, self.restore = kept, restore

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None, *, wait: bool = False) -> None:
        if checkpoint_dir is not None and name is not None:
            shutil.copytree(checkpoint_dir, self.kept / name)
        super().report(metrics, checkpoint_dir, name, wait=wait)

    def restored(self) -> Any:
        import contextlib

        return contextlib.nullcontext(str(self.restore) if self.restore else None)


def test_the_loop_feeds_its_trackers_and_a_restart_continues_the_same_run_with_every_step_once(
        tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop in one process (gloo, world size 1, no Ray), two attempts, the second restored from the first's
    checkpoint as Ray Train restores it; the real server and TensorBoard's reader read the one run back."""
    from mlflow.tracking import MlflowClient

    from raydlc.train import tracking as T

    opened: list[T.Tracking] = []
    real_start = T.start
    monkeypatch.setattr(T, "start", lambda *a, **k: opened.append(real_start(*a, **k)) or opened[-1])
    run = one_worker(steps=8, report_every=2, checkpoint_every=3, tracking="tensorboard,mlflow", mlflow_tracking_uri=mlflow_server,
                     mlflow_experiment_name="loop").model_copy(update={"run_dir": str(tmp_path / "run"), "tracking_id": "loopjob1",
                                                                       "tracking_dir": str(tmp_path / "run")})
    assert run.checkpoint_meta()["tracking_id"] == "loopjob1"  # what a --resume's driver reads back (train.tracking.identity)
    kept = tmp_path / "kept"
    kept.mkdir()
    with world_of_one():
        first = Keeping(kept)
        with pytest.raises(Stop):
            loop(run, Hooks(first, stop_at=7), monkeypatch)  # steps 1-6 read; the crash is before step 7
        opened[0].close()  # what the dead process's thread had written stays; here it gets to finish
        newest = max(kept.iterdir())
        assert T.identity(_manifest_meta(newest), "elsewhere") == ("loopjob1", str(tmp_path / "run"))
        second = Keeping(kept, restore=newest)
        loop(run, Hooks(second), monkeypatch)
    resumed_at = int(newest.name.split("_")[-1])
    assert opened[1].summary() == {} and opened[1].thread is None  # the loop closed it at its end

    c = MlflowClient(mlflow_server)
    (found,) = c.search_runs([c.get_experiment_by_name("loop").experiment_id])
    for key in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/skipped_steps"):
        assert sorted(m.step for m in c.get_metric_history(found.info.run_id, key)) == list(range(1, 9)), key
    assert [m.step for m in c.get_metric_history(found.info.run_id, "events/restart")] == [resumed_at]
    assert {m.step for m in c.get_metric_history(found.info.run_id, "events/checkpoint_saved")} >= {3, 6}
    assert sorted(m.step for m in c.get_metric_history(found.info.run_id, "eval/loss")) == [3, 6, 8]
    assert found.data.params["config/STEPS"] == "8" and found.data.params["plan/world_size"] == "1"
    acc = accumulated(tmp_path / "run" / "tb")
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 9))


def _manifest_meta(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "raydlc_checkpoint.json").read_text())["meta"]


# ---- W&B offline -------------------------------------------------------------------------------


WANDB_HEADER = b":W&B" + (0xBEE1).to_bytes(2, "little") + b"\x00"  # the .wandb file's 7 bytes: ident, magic, version 0
BLOCK = 32 * 1024  # LevelDB's log format, which the .wandb file is: 32 KiB blocks of records that never cross one


def wandb_records(run_dir: Path) -> list:
    """The offline run's records: the .wandb file's LevelDB-log framing (wandb 0.31 dropped its Python reader, the
    DataStore, when the writer moved to wandb-core) parsed here, each record decoded with wandb's own protobuf."""
    from wandb.proto import wandb_internal_pb2

    (f,) = run_dir.glob("*.wandb")
    raw = f.read_bytes()
    assert raw[:7] == WANDB_HEADER
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(raw):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
        if kind == 0 and length == 0:
            break
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        pending += data
        if kind in (1, 4):  # FULL, LAST
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
    return out


def test_wandb_offline_run_holds_history_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    w = where(tmp_path, "jobwandb01")
    t = attempt([WandB(w, "raydlc-test", None, "offline")], range(1, 6), evals=(5,))
    assert t.close(timeout=120) == {}, t.warnings  # type: ignore[attr-defined]
    (run_dir,) = Path(w.wandb_dir, "wandb").glob("offline-run-*-jobwandb01")
    for _ in range(60):  # wandb-core, a process of its own, may still be writing the file when finish() returns on a loaded machine
        recs = wandb_records(run_dir)
        history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item} for r in recs if r.HasField("history")]
        if len([h for h in history if "train/loss" in h]) >= 5:
            break
        time.sleep(1)
    steps = [h["_step"] for h in history if "train/loss" in h]
    assert steps == [1, 2, 3, 4, 5]
    assert [h["train/loss"] for h in history if "train/loss" in h] == pytest.approx([3.0 / s for s in range(1, 6)])
    assert any("eval/loss" in h for h in history)
    config = {i.key: json.loads(i.value_json) for r in recs if r.HasField("config") for i in r.config.update}
    assert config["model"] == "tiny" and config["config/LEARNING_RATE"] == 1e-3
    shutil.rmtree(run_dir)
