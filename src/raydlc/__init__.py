"""raydlc: verified multi-node FSDP fine-tuning on EKS with Ray Train and the AWS Ray Train DLC."""

__version__ = "0.1.0"
