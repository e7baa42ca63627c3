"""The program a Ray job runs: Ray Train + FSDP2 fine-tuning of a Qwen2-architecture causal LM."""
