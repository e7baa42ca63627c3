"""The one Ray edge: addresses, errors, the workers' environment, and a real head joined by address."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc.edges import local_head, ray_runtime
from raydlc.errors import CheckpointError, InputError, RayError
from raydlc.train import metrics as M


def test_an_address_nothing_answers_fails_at_once_instead_of_waiting_forever() -> None:
    port = local_head.free_port()
    with pytest.raises(RayError, match=f"cannot reach Ray at 127.0.0.1:{port}"):
        ray_runtime.check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(InputError, match="not host:port"):
        ray_runtime.check_reachable("nonsense")
    ray_runtime.check_reachable("auto")  # resolved by Ray inside a job
    ray_runtime.check_reachable("ray://head:10001")  # Ray Client: its own timeout


def test_a_port_that_accepts_and_never_answers_fails_in_a_bounded_wait_naming_what_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    from concurrent import futures

    import grpc

    monkeypatch.setattr(ray_runtime, "GCS_ANSWER_S", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)  # the kernel accepts; nobody ever answers
        port = silent.getsockname()[1]
        with pytest.raises(RayError, match=r"nothing answered the gRPC handshake in 0 s \(waited for the head's GCS\)"):
            ray_runtime.check_reachable(f"127.0.0.1:{port}")
    server = grpc.server(futures.ThreadPoolExecutor(1))  # a gRPC server, as the GCS is: it answers the preface
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        ray_runtime.check_reachable(f"127.0.0.1:{port}")
    finally:
        server.stop(None)


@pytest.mark.slow
@pytest.mark.parametrize("token", [None, "0123456789abcdef"])
def test_a_real_heads_gcs_answers_the_handshake(tmp_path: Path, token: str | None) -> None:
    with local_head.start_head(num_cpus=1, log_dir=tmp_path / "head", token=token) as head:  # with Ray's token auth too
        ray_runtime.check_reachable(head.address)


def test_run_errors_keep_raydlcs_own_message_or_name_the_root_cause() -> None:
    try:
        try:
            raise CheckpointError("checkpoint x is corrupt", hint="resume from an earlier one")
        except CheckpointError as inner:
            raise RuntimeError("Training failed due to worker errors") from inner
    except RuntimeError as e:
        mapped = ray_runtime.run_error(e, "training run r", "see the logs")
    # the worker's own error, as it would be raised locally: same class (exit code), message and hint
    assert isinstance(mapped, CheckpointError) and mapped.message == "checkpoint x is corrupt"
    assert mapped.hint == "resume from an earlier one"
    try:
        try:
            raise ValueError("first line\nNCCL error: unhandled system error")
        except ValueError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as e:
        assert ray_runtime.run_error(e, "preflight", "h").message == "preflight failed: NCCL error: unhandled system error"


def test_worker_env_is_decided_once_and_the_callers_value_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", raising=False)
    assert ray_runtime.worker_env() == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1.0", "TOKENIZERS_PARALLELISM": "false"}
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    assert ray_runtime.worker_env({"X": "1"}) == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "TOKENIZERS_PARALLELISM": "false", "X": "1"}


@pytest.mark.slow
def test_a_local_ray_starts_without_the_background_work_nothing_reads() -> None:
    """In a fresh process (the session's Ray would be reused): the local start's system config
    reaches the GCS, its environment every actor, and the driver's environment is left as it was."""
    code = """
import json, os
from raydlc.edges import ray_runtime
with ray_runtime.connected(workers=1, log_to_driver=False):
    import ray
    @ray.remote(num_cpus=0)
    def env():
        return {k: os.environ.get(k) for k in ray_runtime.LOCAL_ENV}
    seen = {"config": ray._private.state.state.get_system_config(), "actor_env": ray.get(env.remote())}
seen["driver_env_after"] = {k: os.environ.get(k) for k in ray_runtime.LOCAL_ENV}
seen["table_after"] = ray_runtime.LOCAL_SYSTEM_CONFIG  # Ray adds keys to the dict it is given: a second start must not inherit them
print(json.dumps(seen))
"""
    env = {k: v for k, v in os.environ.items() if k not in ray_runtime.LOCAL_ENV and k != "RAY_ADDRESS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert {k: seen["config"][k] for k in ray_runtime.LOCAL_SYSTEM_CONFIG} == ray_runtime.LOCAL_SYSTEM_CONFIG
    assert seen["actor_env"] == ray_runtime.LOCAL_ENV
    assert seen["driver_env_after"] == dict.fromkeys(ray_runtime.LOCAL_ENV)
    assert seen["table_after"] == ray_runtime.LOCAL_SYSTEM_CONFIG


@pytest.mark.slow
def test_a_head_in_its_own_process_is_joined_by_address_and_streams_progress(tmp_path: Path) -> None:
    """The cluster entrypoint against a real head, as on a cluster: settings from the command line
    reach the workers, and each step's progress reaches the driver through Ray, not a file."""
    out = tmp_path / "out"
    with local_head.start_head(num_cpus=3, log_dir=tmp_path / "head") as head:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_") and k != "RAY_ADDRESS"}
        env["RAYDLC_WEIGHT_DECAY"] = "0.01"
        r = subprocess.run(
            [sys.executable, "-m", "raydlc.train", "--address", head.address, "--model", "tiny", "--steps", "4", "--seq-len", "32",
             "--batch-size", "2", "--workers", "2", "--lr", "2e-3", "--storage-path", str(out), "--set", "WARMUP_STEPS=2"],
            capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
        )
        group = head.process.pid
    assert r.returncode == 0, r.stdout[-2000:] + _without_native_frames(r.stderr)[-4000:]
    lines = r.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines if ": loss" in line] == ["step 1", "step 2", "step 3", "step 4"]
    assert "step 4: eval loss" in r.stdout
    summary = json.loads(lines[-1])
    assert summary["steps"] == 4 and summary["mesh"]["built"] == [2]
    run_dir = Path(summary["run_dir"])
    progress = M.read_jsonl(run_dir / "progress.jsonl")  # the driver's copy of what the mailbox brought
    assert [rec["step"] for rec in progress if "loss" in rec] == [1, 2, 3, 4]
    seen = json.loads((run_dir / "run.json").read_text())["train"]  # written by rank 0 from the spec it validated
    assert (seen["warmup_steps"], seen["weight_decay"], seen["steps"]) == (2, 0.01, 4)
    lrs = [rec["lr"] for rec in M.read_jsonl(run_dir / "metrics.jsonl") if "loss" in rec]
    assert lrs == pytest.approx([1e-3, 2e-3, 1e-3, 0.0])  # WARMUP_STEPS=2 took effect inside the workers, then the cosine decay
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)  # the head and everything it started are gone


def _without_native_frames(text: str) -> str:
    """Ray's fatal-signal handler prints C stack frames (`binary(symbol+0x..) [0x..]`); the Python error and the signal are above them."""
    return "\n".join(line for line in text.splitlines() if "libpython" not in line and "/lib/" not in line and not re.search(r"\) \[0x[0-9a-f]+\]", line))


@pytest.mark.slow
def test_a_head_with_token_auth_names_a_wrong_or_missing_token_in_one_line_and_takes_the_right_one(tmp_path: Path) -> None:
    """Ray 2.58's GCS refuses a call without its token (UNAUTHENTICATED); ray.init would log a warning a
    second for ~20 s, then blame the address. The right token, from RAY_AUTH_TOKEN alone, connects."""
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"record {i} says hello to the head"}) + "\n" for i in range(50)))
    right = "0123456789abcdef0123456789abcdef"
    with local_head.start_head(num_cpus=2, log_dir=tmp_path / "head", token=right) as head:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_"))} | {"HOME": str(tmp_path)}
        runs = {}
        for name, token in (("wrong", "f" * 32), ("missing", None), ("right", right)):
            env = base | ({"RAY_AUTH_TOKEN": token} if token else {})
            runs[name] = subprocess.run(
                [sys.executable, "-m", "raydlc", "data", "prepare", "d.jsonl", "--out", f"o-{name}", "--address", head.address, "--seq-len", "8"],
                capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
            )
    for name, says in (("wrong", "refused the token from RAY_AUTH_TOKEN"), ("missing", "wants a token and none is set")):
        r = runs[name]
        assert r.returncode == 2 and says in r.stderr.splitlines()[0] and len(r.stderr.splitlines()) == 2, r.stderr
        assert not (tmp_path / f"o-{name}").exists()
    assert runs["right"].returncode == 0, _without_native_frames(runs["right"].stderr)[-6000:]  # once in CI: a native crash, its cause above the frames
    assert (tmp_path / "o-right" / "manifest.json").is_file()
