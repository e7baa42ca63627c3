"""raydlc's kubeconfig: eksctl writes it, raydlc makes itself the exec credential plugin.

eksctl's kubeconfig runs `aws-iam-authenticator`, else `aws eks get-token`, and names
aws-iam-authenticator even when neither is installed (`pkg/utils/kubeconfig/kubeconfig.go`,
`NewForKubectl`, v0.230.0); with only boto3 credentials every Kubernetes call would then fail
while the control plane bills. So after eksctl writes it, the current context's user gets
raydlc's own plugin, `raydlc eks-token` (`raydlc.edges.eks_token`), run by the absolute path of the
raydlc that wrote it, so the Python client, kubectl and helm all get tokens the same way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from raydlc.edges.eks_token import EXEC_APIS


def command() -> list[str]:
    """The running raydlc by absolute path: its console script, else this Python with `-m raydlc`."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "raydlc" and script.is_file():
        return [str(script.absolute())]
    # absolute, not resolved: a venv's python is a link to the base interpreter, which has no raydlc
    return [str(Path(sys.executable).absolute()), "-m", "raydlc"]


def exec_config(cluster: str, region: str) -> dict[str, Any]:
    """The kubeconfig `user.exec` that runs `raydlc eks-token` for this cluster."""
    cmd = command()
    env = [{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}]  # as eksctl's plugin entry sets it
    if os.environ.get("AWS_PROFILE"):
        env.append({"name": "AWS_PROFILE", "value": os.environ["AWS_PROFILE"]})
    return {"apiVersion": EXEC_APIS[0], "command": cmd[0], "args": [*cmd[1:], "eks-token", "--cluster", cluster,
            "--region", region], "env": env, "interactiveMode": "Never", "provideClusterInfo": False}


def use_raydlc_credentials(path: Path, cluster: str, region: str) -> bool:
    """Make the current context's user run raydlc's plugin; True when the file changed."""
    doc = yaml.safe_load(path.read_text()) or {}
    current = doc.get("current-context")
    context = next((c.get("context") or {} for c in doc.get("contexts") or [] if c.get("name") == current), {})
    user = next((u for u in doc.get("users") or [] if u.get("name") == context.get("user")), None)
    want = exec_config(cluster, region)
    if user is None or (user.get("user") or {}) == {"exec": want}:
        return False
    user["user"] = {"exec": want}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return True
