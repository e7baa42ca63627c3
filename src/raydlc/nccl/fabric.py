"""What `fi_info -p efa` says about one node: does libfabric offer an EFA RDM endpoint there?

aws-ofi-nccl drives EFA through reliable-datagram (FI_EP_RDM) endpoints of the efa provider; a
node whose fi_info lists none cannot carry NCCL over EFA, whatever the pod requested. Pure:
the probe's text in, a `Fabric` answer out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Fabric:
    """One node's answer."""

    node: str
    installed: bool  # fi_info was found on the node
    rdm: bool  # an efa provider entry with type FI_EP_RDM
    domains: list[str] = field(default_factory=list)  # the efa RDM domains (one per EFA device)
    detail: str = ""  # why not, in the node's own words

    @property
    def evidence(self) -> str:
        if self.rdm:
            return f"{self.node}: fi_info -p efa lists FI_EP_RDM on {', '.join(self.domains) or 'a domain'}"
        return f"{self.node}: {self.detail}"


def entries(text: str) -> list[dict[str, str]]:
    """fi_info's blocks (`provider: x` then indented `key: value` lines) as dicts."""
    out: list[dict[str, str]] = []
    for raw in text.splitlines():
        key, sep, value = raw.strip().partition(":")
        if not sep:
            continue
        if not raw[:1].isspace() and key == "provider":
            out.append({"provider": value.strip()})
        elif out and raw[:1].isspace():
            out[-1].setdefault(key.strip(), value.strip())
    return out


def judge(node: str, probe: dict[str, Any]) -> Fabric:
    """One node's probe answer (`raydlc.checks.node_probe.fi_info`) as a verdict."""
    output = str(probe.get("output") or "")
    if probe.get("failed"):
        return Fabric(node, False, False, detail=output.strip() or "the probe task did not run")
    if not probe.get("fi_info"):
        return Fabric(node, False, False, detail="fi_info is not installed (no libfabric / EFA installer on this node)")
    rdm = [e for e in entries(output) if e.get("provider", "").split(";")[0] == "efa" and e.get("type") == "FI_EP_RDM"]
    if rdm:
        return Fabric(node, True, True, [e.get("domain", "?") for e in rdm])
    last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "no output")
    return Fabric(node, True, False, detail=f"fi_info -p efa lists no FI_EP_RDM endpoint (exit {probe.get('returncode')}: {last[:200]})")
