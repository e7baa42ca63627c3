"""The trackers on a cluster: MLflow's and W&B's clients reach the job through its runtime env, pinned; their
tokens reach the pods only by Secret reference (the Secret `up` fills from the caller's environment)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from raydlc.config import load_config
from raydlc.errors import InputError
from raydlc.facts import trackers
from raydlc.jobs import runtime_env
from raydlc.jobs.submit import tracker_packages
from raydlc.render import FILES, render_all
from raydlc.render.raycluster import SECRET_KEYS, SECRET_NAME

ZONES = ["us-east-2a", "us-east-2b"]


def config(tmp_path: Path, **overrides: object):
    return load_config(env={}, overrides={"STORAGE_PATH": "s3://raydlc-runs/team", "IDLE_MINUTES": 0, **overrides}, cwd=tmp_path)


def test_the_rayjob_installs_the_trackers_clients_pinned_and_nothing_for_tensorboard(tmp_path: Path) -> None:
    job = render_all(config(tmp_path, TRACKING="tensorboard,mlflow,wandb"), ZONES, only="rayjob")[FILES["rayjob"]]["spec"]
    runtime = yaml.safe_load(job["runtimeEnvYAML"])
    assert runtime["pip"] == ["mlflow-skinny==3.17.2", "wandb==0.31.0"]
    assert runtime["env_vars"]["RAYDLC_TRACKING"] == "tensorboard,mlflow,wandb"
    default = yaml.safe_load(render_all(config(tmp_path), ZONES, only="rayjob")[FILES["rayjob"]]["spec"]["runtimeEnvYAML"])
    assert "pip" not in default  # tensorboardX is in the DLC image


def test_the_pins_install_beside_the_images_torch_and_ray() -> None:
    """runtime_env's own check (what `submit --pip` passes through): neither client replaces the image's torch or ray."""
    assert runtime_env.pin_packages(trackers.packages("mlflow,wandb"), {"torch": "2.13.0", "ray": "2.58.0"}) == [
        "mlflow-skinny==3.17.2", "wandb==0.31.0"]


def test_the_image_lists_tensorboardx_for_the_default_tracker() -> None:
    import json

    packages = json.loads((Path(__file__).parent / "doubles" / "dlc_packages.json").read_text())["packages"]
    assert "tensorboardx" in packages and trackers.PACKAGES["tensorboard"] is None


def test_submit_adds_them_for_a_remote_builtin_job_only(tmp_path: Path) -> None:
    cfg = config(tmp_path, TRACKING="mlflow")
    assert tracker_packages(cfg, "cluster", builtin=True) == ["mlflow-skinny==3.17.2"]
    assert tracker_packages(cfg, "address", builtin=True) == ["mlflow-skinny==3.17.2"]
    assert tracker_packages(cfg, "local", builtin=True) == []  # this machine's Python
    assert tracker_packages(cfg, "cluster", builtin=False) == []  # a script brings its own


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"])
def test_a_token_is_refused_as_an_env_value_of_the_job(name: str) -> None:
    with pytest.raises(InputError, match="looks like a secret"):
        runtime_env.parse_env([f"{name}=abc"])


def test_the_pods_name_each_token_by_secret_reference(tmp_path: Path) -> None:
    docs = render_all(config(tmp_path), ZONES, only="raycluster")[FILES["raycluster"]]
    spec = docs["spec"]
    for c in [spec["headGroupSpec"]["template"]["spec"]["containers"][0],
              *(g["template"]["spec"]["containers"][0] for g in spec["workerGroupSpecs"])]:
        for key in ("MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"):
            assert {"name": key, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": key, "optional": True}}} in c["env"]


def test_up_puts_the_tokens_set_here_into_the_secret_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.lifecycle.resources.raycluster import _secret_values

    for k in SECRET_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-key-123")
    assert _secret_values() == {"WANDB_API_KEY": "wandb-key-123"}
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "mlflow-tok")
    secret = {k: base64.b64encode(v.encode()).decode() for k, v in _secret_values().items()}
    assert set(secret) == {"MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"}


def test_no_config_field_holds_a_trackers_secret() -> None:
    from raydlc.config import FIELDS

    assert not {"MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"} & set(FIELDS)


def test_a_tracking_uri_with_a_password_is_refused_without_showing_it(tmp_path: Path) -> None:
    from raydlc.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        config(tmp_path, MLFLOW_TRACKING_URI="https://me:hunter2secret@mlflow.example.com")
    assert "hunter2secret" not in str(e.value) and "MLFLOW_TRACKING_TOKEN" in str(e.value)
