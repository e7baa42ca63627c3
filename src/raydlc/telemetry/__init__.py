"""Network telemetry: what NCCL says about the transport that carried a job."""
