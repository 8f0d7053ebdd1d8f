"""Training recipes: SFT warm-up and GRPO (its hard cases mined from the policy), driven by YAML configs."""
