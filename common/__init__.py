"""Shared, non-algorithmic pieces of the five GRPO-family scripts.

Each module holds one concern: `rewards` (answer checking), `logprobs`
(per-token log-prob / entropy / NLL), `lowprob` (low-probability token
selection), `rollout` (vLLM and transformers generation + weight sync),
`data` (prompt templates and datasets), `metrics` (per-step logging).
"""
