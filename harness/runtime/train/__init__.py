"""Training on a worker: the FSDP2 train engine, micro-batch layout (shared prompts, length buckets), LoRA."""
