"""Command-line flags from a config dataclass (one flag per field, help from `arg`)."""

import argparse
import dataclasses
import typing
from contextlib import contextmanager


def arg(default, help: str, choices: list | None = None):
    """A config field with its help string (and allowed values)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def parse_args(cls, argv: list[str] | None = None, description: str | None = None):
    """Parse `--field value` flags into an instance of dataclass `cls`.

    Bools accept `--flag` (true) or `--flag false`; `X | None` fields accept `none`.
    `--config FILE.yaml` (a recipe: field: value per line) sets flags, and flags given on
    the command line override it; an unknown or ill-typed key stops with one line.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="YAML file of flags (recipes/); command-line flags override it")
    hints = typing.get_type_hints(cls)
    converters, choices = {}, {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        optional = type(None) in typing.get_args(kind)
        if optional:
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        convert = _bool if kind is bool else kind
        if optional:
            convert = (lambda c: lambda s: None if s.lower() == "none" else c(s))(convert)
        converters[f.name], choices[f.name] = convert, f.metadata.get("choices")
        extra = {"nargs": "?", "const": True} if kind is bool else {}
        parser.add_argument(
            f"--{f.name}",
            type=convert,
            default=f.default,
            choices=choices[f.name],
            help=f"{f.metadata.get('help', '')} (default: {f.default})",
            **extra,
        )
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config", default=None)
    path = config.parse_known_args(argv)[0].config
    if path:
        parser.set_defaults(**_recipe(path, converters, choices))
    values = vars(parser.parse_args(argv))
    values.pop("config")
    return cls(**values)


def _recipe(path: str, converters: dict, choices: dict) -> dict:
    """A recipe's flags, each converted and checked as its command-line flag would be."""
    import yaml

    try:
        raw = yaml.safe_load(open(path, encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"error: --config: cannot read {path} ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise SystemExit(f"error: --config: {path} must map flag names to values")
    unknown = sorted(set(raw) - set(converters))
    if unknown:
        raise SystemExit(f"error: --config: {path} sets unknown flag(s) {unknown}; see --help")
    values = {}
    for key, value in raw.items():
        try:
            values[key] = value if value is None else converters[key](value if isinstance(value, str) else str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise SystemExit(f"error: --config: {path}: {key}: {e}") from None
        if choices[key] and values[key] not in choices[key]:
            raise SystemExit(f"error: --config: {path}: {key} must be one of {choices[key]} (got {value!r})")
    return values


def require(condition: bool, message: str) -> None:
    """Stop with a one-line message naming the bad flag (no traceback)."""
    if not condition:
        raise SystemExit(f"error: {message}")


@contextmanager
def clear_errors(flag: str | None = None):
    """A loader's error (missing file, unreachable hub, missing column) as one line, naming the flag if given."""
    try:
        yield
    except (OSError, ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {flag}: {e}" if flag else f"error: {e}") from None


def check_run_flags(args) -> None:
    """Refuse bad values of the flags every training script shares (not the method's own), one line each."""
    from common.distributed import zero3_requested
    from common.rewards import REWARD_FUNCS

    require(
        args.prompts_per_step >= 1 and args.max_completion_len >= 1 and args.micro_batch_size >= 1,
        "--prompts_per_step, --max_completion_len and --micro_batch_size must be >= 1",
    )
    require(
        min(args.max_tokens_per_micro_batch, args.max_nonfinite_steps, args.warn_flat_steps, args.log_samples) >= 0,
        "--max_tokens_per_micro_batch, --max_nonfinite_steps, --warn_flat_steps and --log_samples must be >= 0",
    )
    require(
        args.verifier_workers >= 0 and args.verifier_memory_mb >= 0 and args.reward_time_budget_s >= 0,
        "--verifier_workers, --verifier_memory_mb and --reward_time_budget_s must be >= 0 (0: automatic / no limit)",
    )
    require(
        args.vllm_max_num_seqs >= 0 and args.vllm_max_num_batched_tokens >= 0 and 0 < args.top_p <= 1,
        "--vllm_max_num_seqs and --vllm_max_num_batched_tokens must be >= 0 (0: automatic), --top_p in (0, 1]",
    )
    require(args.tis_cap >= 0, f"--tis_cap must be >= 0 (got {args.tis_cap}; 0: off)")
    require(
        args.beta == 0 or not zero3_requested(),
        "--beta > 0 under DeepSpeed ZeRO-3: the reference model would be partitioned and never wrapped; "
        "use configs/accelerate/fsdp2.yaml (the reference model is then loaded whole on each GPU) or --beta 0",
    )
    unknown = set(args.rewards.split(",")) - set(REWARD_FUNCS)
    require(not unknown, f"--rewards: unknown term(s) {sorted(unknown)}; choose from {sorted(REWARD_FUNCS)}")
    require(
        args.eval_steps >= 0 and args.eval_n >= 1 and args.eval_temperature > 0,
        "--eval_steps must be >= 0, --eval_n >= 1, --eval_temperature > 0",
    )
