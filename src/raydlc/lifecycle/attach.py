"""An attached run's preflight and the platform as found: reach, permissions first, facts, refusals.

`up --attach` makes nothing at the AWS or cluster scope, so before any step it settles what can be settled
by reading: the API answers through KUBE_CONTEXT (or raydlc's kubeconfig of the EKS cluster CLUSTER_NAME); every
call raydlc will make in NAMESPACE is allowed (one SelfSubjectAccessReview each, every refusal named in one
error that points at `raydlc render --only rbac`); the platform holds a KubeRay operator new enough for what
raydlc renders, and GPU capacity (nodes, or a NodePool that can make them); the SERVICE_ACCOUNT given exists.
What cannot work is one InputError (exit 2), before anything is created.

The found resources of the orders (`Found`) show the facts read here, each with where it came from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError, KubeError
from raydlc.lifecycle.types import Observation
from raydlc.render import FILES

CPU_WORKER_M, CPU_WORKER_MI = 1000, 2048  # a CPU Ray worker on a cluster without GPUs (USE_GPU=false)

if TYPE_CHECKING:
    from raydlc.discovery.facts import ClusterFacts, Fact
    from raydlc.edges.kube import Kube
    from raydlc.lifecycle.context import Context


# ---------------------------------------------------------------------- the way in


def ensure_kubeconfig(ctx: Context) -> None:
    """Without KUBE_CONTEXT: raydlc's kubeconfig of the EKS cluster CLUSTER_NAME, written when absent (eksctl reads
    DescribeCluster and writes a file; nothing in AWS changes), with raydlc's own token plugin, as `up` does."""
    from raydlc.lifecycle import cloud, commands, kubeconfig

    if ctx.kube_context or ctx.kubeconfig.is_file():
        return
    c = ctx.cfg.cluster
    desc = cloud.cluster(ctx.aws("eks"), c.name)
    if desc is None:
        raise InputError(f"no EKS cluster {c.name} in {c.region} to attach to (CLUSTER_NAME, REGION)",
                         hint="raydlc up --attach --kube-context CONTEXT (a context of your kubeconfig)")
    if ctx.dry_run:
        raise InputError(f"no kubeconfig at {ctx.kubeconfig} yet: a dry run writes nothing",
                         hint="raydlc up --attach (writes it), or --kube-context CONTEXT")
    ctx.runner.require("eksctl")
    ctx.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    ctx.tool("cluster", commands.write_kubeconfig(ctx))
    kubeconfig.use_raydlc_credentials(ctx.kubeconfig, c.name, c.region)
    ctx.forget_kube()


def reach(ctx: Context) -> Kube:
    """The API of the attached cluster, checked to answer; else one InputError naming the kubeconfig and context."""
    ensure_kubeconfig(ctx)
    kube = ctx.kube()
    try:
        kube.version()
    except KubeError as e:
        raise InputError(f"the attached cluster does not answer through {ctx.where}: {e.message}",
                         hint="check KUBE_CONTEXT (`kubectl config get-contexts`) and that the API is reachable") from None
    return kube


# ---------------------------------------------------------------------- what raydlc may do there


def check_permissions(ctx: Context, kube: Kube) -> None:
    """Every verb on every resource raydlc will use in the namespace, asked of Kubernetes (one SelfSubjectAccessReview
    each, raydlc.discovery.access), before anything is created: every refusal named in one InputError, which
    `raydlc render --only rbac` fixes. A missing cluster-scope read is a line: its fact will be unknown."""
    from raydlc.discovery import access

    reads = access.require(kube, ctx.cfg.cluster.namespace, service_account_given=bool(ctx.cfg.cluster.service_account))
    if reads:
        ctx.reporter.line("cluster", "note: may not " + ", ".join(str(n) for n in reads) + ": those facts are unknown")


def check_service_account(ctx: Context, kube: Kube) -> None:
    """SERVICE_ACCOUNT names the platform's ServiceAccount the Ray pods run as: it must exist in NAMESPACE."""
    c = ctx.cfg.cluster
    if c.service_account and kube.get("v1", "ServiceAccount", c.service_account, c.namespace) is None:
        raise InputError(f"SERVICE_ACCOUNT {c.service_account} does not exist in namespace {c.namespace}",
                         hint="use the ServiceAccount the platform team gave you, or leave SERVICE_ACCOUNT empty "
                              "(raydlc then makes its own, without cloud access)")


# ---------------------------------------------------------------------- the platform


def facts(ctx: Context) -> ClusterFacts:
    """What the attached cluster holds, read once per run (forbidden reads are unknown, never errors)."""
    if ctx._facts is None:
        from raydlc.discovery.gather import auto_scaling_groups
        from raydlc.discovery.look import look

        name = ctx.cfg.cluster.name
        # asked only on AWS: credentials are first made there, so a cluster not on AWS never needs any
        ctx._facts = look(ctx.kube(), ctx.cfg.cluster.namespace, context=ctx.kube_context,
                          cluster_name=None if ctx.kube_context else name,
                          asgs=lambda: auto_scaling_groups(ctx.aws("autoscaling"), name))
    return ctx._facts  # type: ignore[no-any-return]


def refuse(ctx: Context, found: ClusterFacts) -> None:
    """What makes the RayCluster impossible here, said once before anything is made (exit 2); what could not be
    checked is said as a line. The NetworkPolicy then admits the operator found, in the namespace it runs in."""
    from raydlc.discovery import operator

    manifests = [ctx.documents("raycluster")[FILES["raycluster"]]]
    checked = operator.check(found, manifests)
    for note in checked.notes:
        ctx.reporter.line("kuberay", f"note: {note}")
    op = operator.require(checked)
    ctx.target = target_for(ctx, found)
    if op is not None and op.namespace != ctx.cfg.ray.operator_namespace:
        ctx.cfg = ctx.cfg.model_copy(update={"ray": ctx.cfg.ray.model_copy(update={"operator_namespace": op.namespace})})


def target_for(ctx: Context, found: ClusterFacts) -> Any:
    """The worker group as the found capacity can run it (raydlc.discovery.target.pick; NoGpuCapacity, exit 2, when
    there is none). USE_GPU=false on a cluster without GPUs (kind, CPU Ray): small CPU workers on any node."""
    from raydlc.discovery import target

    cfg = ctx.cfg
    prefer = cfg.gpu_nodes.instance_type if cfg.source("GPU_NODE_TYPE") != "default" else None
    try:
        return target.pick(found, prefer=prefer, configured=(cfg.gpu_nodes.instance_type, cfg.gpu_nodes.gpus_per_node))
    except target.NoGpuCapacity:
        if cfg.train.use_gpu is not False:
            raise
    return target.WorkerTarget(instance_type="cpu", gpus=0, efa=0, node_selector=(), tolerations=(),
                               source="USE_GPU=false: CPU workers wherever they fit", cpu_m=CPU_WORKER_M,
                               memory_mi=CPU_WORKER_MI, note="no GPU capacity: CPU Ray")


def prepare(ctx: Context) -> None:
    """Everything an attached `up` settles before its first step."""
    kube = reach(ctx)
    check_permissions(ctx, kube)
    refuse(ctx, facts(ctx))
    check_service_account(ctx, kube)


# ---------------------------------------------------------------------- each found resource, as `status` shows it


def observed(fact: Fact[Any], known: str, *, missing: str | None = None, empty: bool = False) -> Observation:
    """A fact as a found resource's observation: ready (found), absent (`empty` and nothing found), unknown, or
    not applicable, with the read it came from in `facts`."""
    from raydlc.discovery.facts import State

    doc = {"source": fact.source, "fact": fact.to_dict(), "found": True}
    if fact.state is State.NOT_APPLICABLE:
        return Observation("ready", f"not applicable: {fact.note}", doc)
    if fact.state is State.UNKNOWN:
        return Observation("unknown", f"unknown ({fact.note})", doc)
    if empty and missing is not None:
        return Observation("absent", missing, doc)
    return Observation("ready", known, doc)


def _count(items: Any, what: str) -> str:
    n = len(items)
    return f"{n} {what}{'' if n == 1 else 's'}"


def found_cluster(ctx: Context) -> Observation:
    f = facts(ctx)
    eks = f.eks
    where = f"Kubernetes {f.server_version.get('?')} through {ctx.where}"
    if eks.is_known and eks.value is not None:
        return observed(eks, f"{where}; EKS cluster {eks.value.name} ({eks.value.version or '?'})")
    obs = observed(eks, where)
    return Observation(obs.state, f"{where}; AWS: {obs.reason}", obs.facts)


def found_capacity(ctx: Context) -> Observation:
    f = facts(ctx)
    nodes = [n for n in f.gpu_nodes.get(()) if n.ready]
    pools, groups = f.node_pools.get(()), f.asg_groups.get(())
    parts = [_count(nodes, "Ready GPU node")]
    if pools:
        parts.append(f"{_count(pools, 'NodePool')} that can make GPU nodes ({', '.join(p.name for p in pools)})")
    if groups:
        parts.append(f"{_count(groups, 'node group')} at zero ({', '.join(g.name for g in groups)})")
    return observed(f.gpu_nodes, "; ".join(parts), missing="no GPU node, NodePool or node group that can make one",
                    empty=not (nodes or pools or groups))


def found_gpu_nodes(ctx: Context) -> Observation:
    f = facts(ctx)
    nodes = f.gpu_nodes.get(())
    kinds: dict[tuple[Any, ...], int] = {}
    for n in nodes:
        key = (n.instance_type or "?", n.gpus, n.efa, ",".join(sorted(t.key for t in n.taints)), n.capacity_type or "?",
               n.hyperpod)
        kinds[key] = kinds.get(key, 0) + 1
    lines = [f"{k} × {t} ({g} GPUs, {e} EFA{', tainted ' + taints if taints else ''}, {cap}{', HyperPod' if hp else ''})"
             for (t, g, e, taints, cap, hp), k in sorted(kinds.items())]
    if any(n.capacity_type == "spot" for n in nodes):
        lines.append("Spot: a reclaimed node's Ray worker is drained (the Ray job checkpoints and goes on)")
    return observed(f.gpu_nodes, "; ".join(lines), missing="no GPU node now", empty=not nodes)


def found_kuberay(ctx: Context) -> Observation:
    f = facts(ctx).kuberay
    ops = f.operators.get(())
    crds = f.crds.get(())
    if not f.operators.is_known:
        return observed(f.operators, "")
    text = "; ".join(
        f"KubeRay {o.version or o.image} in {o.namespace} (watches "
        + ("every namespace" if o.watch.all_namespaces else ", ".join(o.watch.namespaces) or "a list in its config file")
        + ("" if o.available else ", not available") + ")" for o in ops)
    if crds:
        text += "; CRDs " + ", ".join(f"{c.name} ({'/'.join(c.served_versions)})" for c in crds)
    return observed(f.operators, text, missing="no KubeRay operator", empty=not ops)


def found_plugins(ctx: Context) -> Observation:
    f = facts(ctx).device_plugins
    plugins = f.get(())
    text = "; ".join(f"{p.name} in {p.namespace} ({p.resource}): {p.ready}/{p.desired} ready" for p in plugins)
    return observed(f, text, missing="no NVIDIA or EFA device-plugin DaemonSet found", empty=not plugins)


def found_autoscaler(ctx: Context) -> Observation:
    f = facts(ctx).node_autoscaler
    what = f.get("")
    if f.is_known and what in ("", "none"):
        return observed(f, "no node autoscaler found: GPU nodes the Ray workers leave stay (and bill) until the "
                           "platform removes them")
    return observed(f, f"{what}: removes a GPU node once Ray's autoscaler has let its worker go")


def found_storage(ctx: Context) -> Observation:
    c, path = ctx.cfg.cluster, ctx.cfg.train.storage_path
    who = f"ServiceAccount {c.service_account}" if c.service_account else "raydlc's ServiceAccount (no cloud identity)"
    doc = {"source": "config STORAGE_PATH, SERVICE_ACCOUNT", "found": True}
    if not path:
        return Observation("absent", f"no STORAGE_PATH: give s3://bucket/prefix the pods can write as {who}", doc)
    return Observation("ready", f"STORAGE_PATH {path}, written by the Ray pods as {who} (`raydlc verify` probes it)", doc)


def priced_as_found(cfg: Any) -> Any:
    """The config with GPU_NODE_TYPE and GPUS_PER_NODE as the attached RayCluster's worker group has them (its node
    selector's instance type, its GPUs), so that a job's budget is priced from the found type: a type raydlc's table
    lacks (HyperPod's `ml.` types) has no price, and the budget is refused, never kept at $0."""
    from raydlc.edges.kube import Kube, load_client
    from raydlc.lifecycle.context import kube_target, with_plain_kubeconfig

    path, context = kube_target(with_plain_kubeconfig(cfg))
    rc = Kube(load_client(path, context)).get("ray.io/v1", "RayCluster", cfg.ray.cluster_name, cfg.cluster.namespace) or {}
    groups = (rc.get("spec") or {}).get("workerGroupSpecs") or []
    spec = ((groups[0].get("template") or {}).get("spec") or {}) if groups else {}
    itype = (spec.get("nodeSelector") or {}).get("node.kubernetes.io/instance-type")
    gpus = str((groups[0].get("rayStartParams") or {}).get("num-gpus", "")) if groups else ""
    if not itype or not gpus.isdigit() or int(gpus) < 1:
        return cfg
    found = cfg.gpu_nodes.model_copy(update={"instance_type": itype, "gpus_per_node": int(gpus)})
    return cfg.model_copy(update={"gpu_nodes": found})
