"""GRPO with the KG search tool in the loop:
`torchrun --nproc_per_node N train/grpo.py --config configs/<model>/grpo.yaml [--resume]`."""

from kgreasoner.training.grpo import GRPORecipe, train_grpo
from kgreasoner.training.launch import train_main

if __name__ == "__main__":
    train_main(__doc__, GRPORecipe, train_grpo, "continue the first unfinished episode from its last checkpoint")
