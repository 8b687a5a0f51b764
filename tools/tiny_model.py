"""Build a CPU demo model into a directory of your choice; common/tiny_model.py says what it is.

    python -m tools.tiny_model --output /tmp/tiny            # then: python grpo_base.py --model /tmp/tiny

`--model tiny` does not need this: it loads the model shipped in models/tiny-arith, whose tiny_model.json
holds the command that made it. A rebuild differs from it by this machine's CPU kernels and thread count,
so the README's demo figures are not a rebuild's.
"""

from dataclasses import dataclass
from pathlib import Path

from common.cli import arg, parse_args

DEFAULT_OUTPUT = Path.home() / ".cache" / "grpo-zoo" / "tiny-arith-rebuilt"


@dataclass
class Args:
    # What to build.
    output: str = arg(str(DEFAULT_OUTPUT), "directory to write the model and tokenizer to (must not exist)")
    sft_steps: int = arg(500, "supervised warm-start steps (0: a random model)", at_least=0)
    sft_noise: float = arg(0.5, "share of SFT solutions without \\boxed{}", at_least=0, at_most=1)
    seed: int = arg(0, "random seed")
    threads: int = arg(1, "torch threads for the build (the weights depend on them)", at_least=1)


if __name__ == "__main__":
    args = parse_args(Args, description=__doc__)
    from common.tiny_model import SHIPPED_DIR, build_tiny_model

    path = build_tiny_model(
        args.output, args.sft_steps, sft_noise=args.sft_noise, seed=args.seed, threads=args.threads, progress=True
    )
    if path.resolve() == SHIPPED_DIR:
        print(
            f"rebuilt the shipped demo model {path}: measure the README's demo figures again (scripts/compare_demo.sh)"
        )
    else:
        print(
            f"built {path}: train on it with --model {path}. Its weights differ from the shipped models/tiny-arith "
            "(`--model tiny`) by this machine's kernels and threads, so the README's demo figures are not its figures."
        )
