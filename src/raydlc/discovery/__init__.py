"""Discovery: what an existing cluster holds, read as it is (attach mode), as frozen facts with their sources.

`facts` holds the shapes; `read` turns raw API answers into them (pure); `operator` checks the KubeRay
operator against what raydlc renders; `target` picks the worker group's shape from what was found;
`access` lists and checks the Kubernetes permissions raydlc needs. Nothing here talks to a cluster: the
reads are in `raydlc.edges.kube` and `raydlc.edges.discovery`, which hand their answers in.
"""
