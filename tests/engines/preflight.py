"""The memory preflight under a real engine, a JSON file per rank in RUN_DIR (run by tests/test_preflight.py).

    accelerate launch --config_file configs/accelerate/zero3.yaml tests/engines/cpu_entry.py \
        tests/engines/preflight.py PLANS.json RUN_DIR

The accelerator comes from the trainer's own step (`common.trainer.open_accelerator`, as `start_session`
builds it on a GPU: bf16 mixed precision, whose engine settings are reported); then, for each plan of PLANS.json (a recipe's model config directory and flags), the parameter
count and `common.models.check_memory` on a device of the stated GiB: the plan, or the one line it stops
with. Under ZeRO-3 the accelerator leaves transformers' ZeRO-3 hook set (an HfDeepSpeedConfig alive): the
count must neither crash in zero.Init nor see partitioned (empty) parameters, and the hook must stay set.
"""

import dataclasses
import json
import sys
from pathlib import Path

from transformers.integrations import is_deepspeed_zero3_enabled

from common.models import check_memory, model_config, precision_for
from common.run_flags import RunFlags
from common.trainer import end_run, open_accelerator

plans, run_dir = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
first = next(iter(plans.values()))
run_dir.mkdir(parents=True, exist_ok=True)  # as check_writable leaves it, before the accelerator
# As a GPU run builds it: bf16 autocast (accelerate allows it on CPU), so the engines' bf16 settings are made too.
accelerator, mode = open_accelerator(
    RunFlags(output_dir=str(run_dir)), 1.0, precision_for("auto", gpu=True), run_dir, first["model_dir"], False, None
)
facts = {
    "rank": accelerator.process_index,
    "mode": mode.kind,
    "world": mode.world,
    "mixed": accelerator.mixed_precision,
}
if (fsdp := getattr(accelerator.state, "fsdp_plugin", None)) is not None:
    policy = fsdp.mixed_precision_policy
    facts["fsdp_dtypes"] = [str(policy.param_dtype), str(policy.reduce_dtype)]
if (ds := getattr(accelerator.state, "deepspeed_plugin", None)) is not None:
    config = ds.deepspeed_config
    keys = ("data_types", "communication_data_type", "gradient_clipping", "train_batch_size", "zero_optimization")
    facts["ds_config"] = {k: config.get(k) for k in keys}
facts["zero3_hook"] = is_deepspeed_zero3_enabled()
for name, plan in plans.items():
    run = dataclasses.replace(RunFlags(), **plan["flags"])
    out = {"count": model_config(plan["model_dir"])[1]}
    try:
        out["plan"] = check_memory(run, plan["model_dir"], mode, plan["reference_model"], plan["device_gib"])
    except SystemExit as stop:
        out["refused"] = str(stop)
    facts[name] = out
facts["zero3_hook_after"] = is_deepspeed_zero3_enabled()
# A file per rank, not a line on stdout: the ranks share the launcher's output, where lines can interleave.
(run_dir / f"preflight-rank{accelerator.process_index}.json").write_text(json.dumps(facts))
end_run(accelerator)
