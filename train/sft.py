"""SFT warm-up: `torchrun --nproc_per_node N train/sft.py --config configs/<model>/sft.yaml`."""

from kgreasoner.training.launch import train_main
from kgreasoner.training.sft import SFTRecipe, train_sft

if __name__ == "__main__":
    train_main(__doc__, SFTRecipe, train_sft, "continue from the last checkpoint in run_dir")
