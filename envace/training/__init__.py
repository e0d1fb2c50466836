"""envace.training: configuration, GRPO losses, the train loop and its setup, checkpoints and
resume, data parallel and FSDP, SFT, and the fidelity metrics logged while training."""
