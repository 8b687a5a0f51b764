"""The baselines the four papers compare against, each a copy of grpo_base.py changed only by its paper's idea
(`diff grpo_base.py baselines/gspo.py`). Run them as files: `python baselines/gspo.py`."""
