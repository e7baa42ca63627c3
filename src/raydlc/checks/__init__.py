"""Proving a cluster and a run: the verify gate, the per-node probes, the preflight and the transport benchmark."""
