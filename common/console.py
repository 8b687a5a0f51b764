"""What the console shows: our progress bar and lines; library notices that need no action, filtered.

The libraries' notices that a user of these scripts cannot act on (vLLM's CPU build notes, a
chat-template warm-up that cannot apply to an engine we feed token ids, accelerate's note on
tied weights, DeepSpeed's CPU-accelerator notice, progress bars under ours) are filtered; their
warnings that call for action (a KV cache too small, a failed load) still show.
"""

import logging
import os
import warnings
from pathlib import Path

# Library log lines that need no action here: the reason each is expected is in the comment.
BENIGN = (
    "The global random seed is set to",  # vLLM: we seed it ourselves
    "Enforce eager set",  # vLLM on CPU: we ask for eager mode (torch.compile's warm-up costs a minute)
    "Inductor compilation was disabled",
    "Triton is not installed",  # vLLM's CPU build
    "Triton is installed, but doesn't include CPU backend",
    "Reset SSM cache type",
    "Model Runner V2 requires Triton",
    "is not found in LD_PRELOAD",  # vLLM CPU performance tips (tcmalloc, iomp)
    "CPU backend doesn't allow to use `torch.set_num_threads`",
    "Chat template warmup failed",  # vLLM's engine gets token ids: it has no tokenizer to warm up
    "Using None for EOS token id because tokenizer is not initialized",  # stop tokens are passed per request
    "Removed shared tensor",  # accelerate: tied embeddings are saved once, as intended
    "Setting accelerator to CPU",  # DeepSpeed, imported by a library on a machine without a GPU: expected
    "does not officially support disabling chunked prefill",  # vLLM on CPU: whole prompts, for per-prompt seeds
    # vLLM in bf16 reading an fp32 checkpoint (the demo models, SmolLM2): the narrowing --precision asked for
    "with dtype torch.float32 into parameter with dtype torch.bfloat16",
)


class BenignFilter(logging.Filter):
    """Drops BENIGN lines (also named by configs/vllm_logging.json, vLLM's logging config here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(b in message for b in BENIGN)


def quiet_libraries() -> None:
    """Filter BENIGN lines from Python's last-resort handler (which prints for libraries that set up
    none: accelerate, vLLM at import) and, through configs/vllm_logging.json, from vLLM's own handler
    (set up when an engine starts); silence deprecation notices libraries raise about their own
    dependencies; turn transformers' progress bars off. A user's VLLM_LOGGING_CONFIG_PATH wins."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op.* is deprecated")
    os.environ.setdefault(
        "VLLM_LOGGING_CONFIG_PATH", str(Path(__file__).parent.parent / "configs" / "vllm_logging.json")
    )
    for name in ("DeepSpeed",):  # libraries with a handler of their own: the filter sits on their logger
        library = logging.getLogger(name)
        if not any(isinstance(f, BenignFilter) for f in library.filters):
            library.addFilter(BenignFilter())
    handler = logging.lastResort
    if handler is not None and not any(isinstance(f, BenignFilter) for f in handler.filters):
        handler.addFilter(BenignFilter())
