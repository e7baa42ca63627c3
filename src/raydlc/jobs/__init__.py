"""Running jobs on a Ray head: which head (targets), what travels with a job, submit/attach/follow/stop, the RayJob, a cold cluster's start."""
