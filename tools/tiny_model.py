"""Build the CPU demo model (`--model tiny`) into a directory of your choice; common/tiny_model.py says what it is.

python -m tools.tiny_model --output /tmp/tiny --sft_steps 500
"""

from dataclasses import dataclass

from common.cli import arg, parse_args
from common.tiny_model import DEFAULT_DIR


@dataclass
class Args:
    # What to build.
    output: str = arg(str(DEFAULT_DIR), "directory to write the model and tokenizer to")
    sft_steps: int = arg(500, "supervised warm-start steps (0: a random model)", at_least=0)
    sft_noise: float = arg(0.5, "share of SFT solutions without \\boxed{}", at_least=0, at_most=1)
    seed: int = arg(0, "random seed")


if __name__ == "__main__":
    args = parse_args(Args, description=__doc__)
    from common.tiny_model import build_tiny_model

    print(build_tiny_model(args.output, sft_steps=args.sft_steps, sft_noise=args.sft_noise, seed=args.seed))
