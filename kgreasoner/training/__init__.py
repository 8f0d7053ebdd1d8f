"""Training recipes: SFT warm-up, hard-case mining and GRPO, driven by YAML configs."""
