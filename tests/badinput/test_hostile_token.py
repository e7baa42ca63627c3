"""A Ray token no HTTP header can carry (CR/LF, 100 kB, non-ASCII) is refused before any connection, naming
where it came from, and no byte of it shows: not in stdout, stderr, or any file the command leaves.

Every command with `--address` takes the token Ray's own clients take (RAY_AUTH_TOKEN, the file
RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token); the list below must name each of them.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from raydlc.cli import app

HEX = secrets.token_hex(24)
TOKENS = {
    "crlf": f"{HEX}\r\nX-Injected: {secrets.token_hex(8)}",
    "100kB": secrets.token_hex(50_000),
    "non-ascii": f"{HEX[:20]}é密{HEX[20:]}",
}
# Each command that takes --address, with what else it needs to get as far as the token.
DASHBOARD, GCS = "{dashboard}", "{gcs}"
COMMANDS = {
    "submit": ["submit", "--builtin", "--address", DASHBOARD],
    "job list": ["job", "list", "--address", DASHBOARD],
    "job status": ["job", "status", "x1", "--address", DASHBOARD],
    "job logs": ["job", "logs", "x1", "--address", DASHBOARD],
    "job stop": ["job", "stop", "x1", "--address", DASHBOARD],
    "verify": ["verify", "--address", DASHBOARD],
    "bench-transport": ["bench-transport", "--address", DASHBOARD],
    "train": ["train", "--address", GCS],
    "data prepare": ["data", "prepare", "d.jsonl", "--address", GCS],
}


def _with_address(group: typer.core.TyperGroup, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, cmd in group.commands.items():
        if isinstance(cmd, typer.core.TyperGroup):
            out |= _with_address(cmd, f"{prefix}{name} ")
        elif any("--address" in getattr(p, "opts", ()) for p in cmd.params):
            out.add(prefix + name)
    return out


def test_the_list_names_every_command_that_takes_a_token() -> None:
    assert _with_address(typer.main.get_command(app)) == set(COMMANDS)  # type: ignore[arg-type]


def _leaks(token: str, text: str) -> list[str]:
    """Every 8-character run of `text` that is also in the token."""
    return sorted({text[i:i + 8] for i in range(len(text) - 7) if text[i:i + 8] in token})


@pytest.mark.parametrize("kind", sorted(TOKENS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_hostile_token_is_refused_unshown(command: str, kind: str, tmp_path: Path, refused_url: str) -> None:
    token = TOKENS[kind]
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "d.jsonl").write_text('{"text": "hello there"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_", "AWS_"))}
    by_file = command in ("job list", "data prepare")  # these read it from the file RAY_AUTH_TOKEN_PATH names
    if by_file:
        (home / "tok").write_text(token)
        env["RAY_AUTH_TOKEN_PATH"] = str(home / "tok")
    else:
        env["RAY_AUTH_TOKEN"] = token
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", AWS_EC2_METADATA_DISABLED="true")
    gcs = refused_url.removeprefix("http://")
    args = [a.replace(DASHBOARD, refused_url).replace(GCS, gcs) for a in COMMANDS[command]]
    p = subprocess.run([sys.executable, "-m", "raydlc", *args], capture_output=True, text=True, env=env, cwd=work, timeout=90,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    first = p.stderr.splitlines()[0]
    assert first.startswith("error: ") and "the Ray token" in first and "not shown" in first, p.stderr
    assert ("token file" if by_file else "RAY_AUTH_TOKEN") in first
    assert "Traceback" not in p.stderr
    assert _leaks(token, p.stdout + p.stderr) == []
    for f in [*home.rglob("*"), *work.rglob("*")]:
        if f.is_file() and f.name != "tok":
            assert _leaks(token, f.read_text(errors="replace")) == [], f


def test_a_good_token_passes_and_a_header_carries_it() -> None:
    from raydlc.edges.ray_dashboard import check_token, headers

    assert headers("abc-DEF_123.~+/=") == {"Authorization": "Bearer abc-DEF_123.~+/="}
    assert check_token("x" * 4096, "f") == "x" * 4096


# ---- the experiment trackers' tokens: read from the environment only, named in files by Secret reference ----

TRACKER_TOKENS = ("MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY")


@pytest.mark.parametrize("kind", sorted(TOKENS))
@pytest.mark.parametrize("name", TRACKER_TOKENS)
def test_a_trackers_token_is_never_rendered_or_shown(name: str, kind: str, tmp_path: Path) -> None:
    """`raydlc render` with every tracker on: the token's variable appears only as a secretKeyRef; no byte of its value
    in stdout, stderr or any rendered file."""
    token = TOKENS[kind]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_", "AWS_", "MLFLOW_", "WANDB_"))}
    env.update({name: token, "RAYDLC_TRACKING": "tensorboard,mlflow,wandb", "RAYDLC_STORAGE_PATH": "s3://raydlc-runs/runs",
                "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"})
    p = subprocess.run([sys.executable, "-m", "raydlc", "render", "--out", "out", "--zones", "us-east-2a,us-east-2b"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=90, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert _leaks(token, p.stdout + p.stderr) == []
    files = [f for f in (tmp_path / "out").rglob("*") if f.is_file()]
    assert files
    for f in files:
        assert _leaks(token, f.read_text(errors="replace")) == [], f
    cluster = (tmp_path / "out" / "raycluster.yaml").read_text()
    assert f"key: {name}" in cluster and cluster.count("secretKeyRef") >= 2


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_a_hostile_mlflow_token_fails_the_tracker_unshown(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's client refuses to send such a token (or the server refuses it): one warning naming the tracker, no byte of it."""
    pytest.importorskip("mlflow")
    from raydlc.train.tracking import MLflow, Tracking, TrackingRun

    token = TOKENS[kind]
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    said: list[str] = []
    t = Tracking([MLflow(TrackingRun("t1", "r", str(tmp_path / "tb"), str(tmp_path / "w")), f"http://127.0.0.1:{port}", "x")],
                 on_warning=said.append)
    t.start(start_step=0, history=[], params={"a": 1})
    assert list(t.close(timeout=60)["trackers_stopped"]) == ["mlflow"]
    assert len(said) == 1 and said[0].startswith("tracker mlflow stopped")
    assert _leaks(token, said[0]) == []
