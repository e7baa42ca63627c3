"""What to check when a report shows a fallback or no EFA, in the order worth checking."""

from __future__ import annotations

from raydlc.nccl.report import NcclReport


def likely_causes(r: NcclReport) -> list[str]:
    """The checks a person should run next, read off the verdict, the failures and the settings in force."""
    out: list[str] = []
    if not (r.fallback or r.verdict in ("socket", "libfabric", "libfabric-other", "mixed") or r.failures):
        return out
    texts = " ".join(e.text for e in r.failures).lower()
    if any(e.kind == "network" for e in r.failures):
        out.append("NCCL_NET names a network that is not there: for EFA the plugin must load (NCCL_NET=Libfabric needs libnccl-net-ofi.so on LD_LIBRARY_PATH or NCCL_NET_PLUGIN=ofi)")
    if r.fallback_from == "ib":
        out.append("InfiniBand/RoCE failed: is /dev/infiniband mounted in the container (RDMA device plugin or privileged)? Does NCCL_IB_HCA name a present HCA? Is nvidia-peermem loaded for GPUDirect?")
    if "empty list" in texts or "fi_getinfo" in texts or "no eligible" in texts or "optimal provider" in texts:
        out.append("no EFA device visible in the container: is /dev/infiniband/uverbs* mounted? Does the pod request vpc.amazonaws.com/efa? Is the EFA device plugin DaemonSet ready on the node?")
    if "version `" in texts or "cannot open shared object" in texts or "undefined symbol" in texts:
        out.append("the net plugin could not be loaded: libfabric / aws-ofi-nccl versions in the image do not match (check LD_LIBRARY_PATH and /opt/amazon/efa/lib)")
    if r.verdict == "libfabric":
        out.append("the OFI plugin carried the traffic, but no line proves its provider: set NCCL_DEBUG_SUBSYS=INIT,NET so the "
                   "plugin prints 'Selected provider is …' at start-up, and FI_PROVIDER=efa so it can only be EFA")
    if r.provider and r.provider.split(";")[0] not in ("efa", "efa-direct"):
        out.append(f"the OFI plugin selected provider {r.provider!r}, not efa: check FI_PROVIDER=efa and that fi_info -p efa lists a device")
    if r.fallback_from != "ib" and (r.verdict in ("socket", "mixed") or r.fallback):
        out.append("EFA resource requested by the pod (vpc.amazonaws.com/efa in limits)? device plugin ready (kubectl get ds -n kube-system aws-efa-k8s-device-plugin)?")
        out.append("FI_PROVIDER=efa set in the worker environment? /dev/infiniband mounted in the container?")
        if "NCCL_NET" not in r.env:
            out.append("NCCL_NET is not pinned: set NCCL_NET=Libfabric (or 'AWS Libfabric' on older plugins) so a missing EFA fails loudly instead of falling back to sockets")
    if r.verdict == "mixed":
        out.append("ranks disagree: compare the nodes in the table; one node's EFA device or plugin differs from the others")
    return out
