"""The EKS calls moto 5.2 lacks, answered from the state the eksctl double keeps: add-ons and pod
identity associations.

The double (a subprocess) records what eksctl would have made through the EKS API in a JSON file
beside the scenario file; `handlers` answers raydlc's `ListAddons` and `ListPodIdentityAssociations`
from it with botocore `before-call` handlers, in the test's process. Shapes as the EKS API returns
them (botocore's service model: `addons`, `associations` with `namespace` and `serviceAccount`).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCENARIO_ENV = "DOUBLES_SCENARIO"
ACCOUNT = "123456789012"


def path_for(scenario_file: str | os.PathLike[str]) -> Path:
    return Path(scenario_file).with_name("eks-state.json")


def _read(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text() or "{}")) if path.is_file() else {}


def read(path: Path, cluster: str) -> dict[str, Any]:
    """One cluster's state: {"addons": [names], "associations": ["namespace/serviceAccount"]}."""
    return {"addons": [], "associations": [], **_read(path).get(cluster, {})}


def current(cluster: str) -> dict[str, Any]:
    """One cluster's state, as the double running now sees it."""
    return read(path_for(os.environ[SCENARIO_ENV]), cluster)


@contextmanager
def changing(cluster: str) -> Iterator[dict[str, Any]]:
    """The double's read-modify-write of one cluster's state, under a file lock (eksctl calls may overlap)."""
    path = path_for(os.environ[SCENARIO_ENV])
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        whole = _read(path)
        state = {"addons": [], "associations": [], **whole.get(cluster, {})}
        yield state
        whole[cluster] = state
        path.write_text(json.dumps(whole))


def forget(cluster: str) -> None:
    """`delete cluster`: EKS deletes the cluster's add-ons and associations with it."""
    with changing(cluster) as state:
        state.update(addons=[], associations=[])


def handlers(path: Path) -> dict[str, Callable[..., Any]]:
    """`before-call` answers (awsstub.Answer) to ListAddons and ListPodIdentityAssociations from the double's state."""
    from awsstub import Answer

    def addons(params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"addons": sorted(read(path, params["clusterName"])["addons"])}

    def associations(params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        cluster = params["clusterName"]
        found = []
        for i, name in enumerate(sorted(read(path, cluster)["associations"])):
            namespace, sa = name.split("/", 1)
            found.append({"clusterName": cluster, "namespace": namespace, "serviceAccount": sa, "associationId": f"a-{i:08d}",
                          "associationArn": f"arn:aws:eks:us-east-2:{ACCOUNT}:podidentityassociation/{cluster}/a-{i:08d}"})
        return 200, {"associations": found}

    return {**Answer("eks", "ListAddons", addons).events(), **Answer("eks", "ListPodIdentityAssociations", associations).events()}
