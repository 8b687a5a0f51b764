"""What the comparison runs: the methods, baselines and ablations, their scripts and flags, the seeds and the
budget, each run's evaluations, and what each paper claims. Nothing here runs anything."""

from dataclasses import dataclass

METHODS = ("grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo")
BASELINES = ("dapo", "dr_grpo", "gspo", "kl_cov", "clip_cov")  # baselines/<name>.py, or a variant of one
VARIANTS = {"clip_cov": ("kl_cov", ["--variant", "clip_cov"])}  # name -> (the script's method, its flags)
# name: (method, the flags that turn its idea off, in words): the same script and defaults, so that the method
# against it reads the idea alone (GRPO differs from a method in its temperature and defaults as well).
ABLATIONS = {
    "edge_grpo-off": ("edge_grpo", ["--gec", "off", "--eda", "false"], "GEC and EDA off"),
    "edge_grpo-gec": ("edge_grpo", ["--eda", "false"], "GEC alone (EDA off)"),
    "edge_grpo-eda": ("edge_grpo", ["--gec", "off"], "EDA alone (GEC off)"),
    # Not an ablation: the opt-in stabiliser (a departure from the paper), read beside the method and its ablation.
    "edge_grpo-bound": ("edge_grpo", ["--eda_ratio_bound", "10"], "EDA's P_hat bounded to [0.1, 10]"),
    "cw_grpo-off": ("cw_grpo", ["--cw", "false"], "the kernel off"),
    "pro_grpo-off": ("pro_grpo", ["--alpha", "0"], "the re-weighting off (alpha 0)"),
    "egpo-off": ("egpo", ["--lambda_max", "1", "--lambda_min", "1", "--nsr", "false"], "the weighting and NSR off"),
}
# A partial ablation's part turned off, read as "that part, added to the rest" when the method differs from it.
PART_OFF = {"edge_grpo-gec": "EDA", "edge_grpo-eda": "GEC"}
STABILISERS = ("edge_grpo-bound",)  # read beside the method, not as its ablation
SCRIPT = {m: f"baselines/{VARIANTS.get(m, (m,))[0]}.py" if m in BASELINES else f"{m}.py" for m in METHODS + BASELINES}
SCRIPT |= {a: SCRIPT[m] for a, (m, _, _) in ABLATIONS.items()}
# TRL's GRPOTrainer configured as BASE: the reference against the implementation most users run. A check of the
# reference, outside the primary family: "not told apart" is the expected reading.
REFERENCE = "trl"
SCRIPT[REFERENCE] = "scripts/comparison/trl_grpo.py"
ROWS = METHODS + BASELINES + (REFERENCE,)  # the verdict table's runs
ORDER = ROWS + tuple(ABLATIONS)  # BASE first: its run evaluates the policy before training
BASE = "grpo_base"

SEEDS = (0, 1, 2, 3, 4)
STEPS = 8
EVAL_N = 8  # samples per held-out sum: pass@1, 2, 4, 8
EVAL_TEMPERATURE = 1.0  # every run's own evaluation; the methods' training T (CW-GRPO's is 0.7, EDGE-GRPO's 0.6)
BENCH = "sums"
# scripts/real_model_demo.py's flags, less its length and evaluation schedule.
FLAGS = [
    "--few_shot", "2", "--prompts_per_step", "6", "--group_size", "8", "--max_completion_len", "32",
    "--lr", "1e-5", "--micro_batch_size", "8", "--save_minutes", "0",
]  # fmt: skip

# Each method's own evaluation setting: ((temperature, top-p), whose, its paper's?), as docs/algorithms/<method>.md
# states it; T 0 is greedy. GSPO's paper states no decoding: it has none here.
EVAL_SETTINGS = {
    "edge_grpo": ((0.1, 1.0), "its paper's (Evaluation Benchmark)", True),
    "egpo": ((0.6, 0.95), "the project's choice: EGPO's paper lost its values", False),
    "cw_grpo": ((0.6, 0.95), "Open-RS's, which CW-GRPO follows: its paper states none", False),
    "pro_grpo": ((0.6, 0.95), "its paper's (Sec. 4.2)", True),
    "dapo": ((1.0, 0.7), "its paper's (Sec. 4.1)", True),
    "dr_grpo": ((0.0, 1.0), "its paper's (Sec. 2.2)", True),
    "kl_cov": ((0.0, 1.0), "its paper's (Sec. 4.3; AIME and AMC aside, sampled at T = 0.6)", True),
    "clip_cov": ((0.0, 1.0), "its paper's (Sec. 4.3; AIME and AMC aside, sampled at T = 0.6)", True),
}
# The project's runs each paper compares its method with in its tables, read at that method's setting too: EGPO's
# Table 1 (GRPO, DAPO, EDGE-GRPO), CW-GRPO's Table 2 (GRPO, Clip-Cov), Pro-GRPO's Table 2 (GRPO, GRPO w/ KL-Cov).
COMPARED_WITH = {"egpo": ("dapo", "edge_grpo"), "cw_grpo": ("clip_cov",), "pro_grpo": ("kl_cov",)}

NAMES = {
    "grpo_base": "GRPO",
    "edge_grpo": "EDGE-GRPO",
    "egpo": "EGPO",
    "cw_grpo": "CW-GRPO",
    "pro_grpo": "Pro-GRPO",
    "dapo": "DAPO",
    "dr_grpo": "Dr. GRPO",
    "gspo": "GSPO",
    "kl_cov": "KL-Cov",
    "clip_cov": "Clip-Cov",
    REFERENCE: "TRL's GRPOTrainer",
}
NAMES |= {a: f"{NAMES[m]}, {off}" for a, (m, _, off) in ABLATIONS.items()}
TAB = "blue orange green red purple brown pink olive cyan".split()  # matplotlib's tab: colours, in turn
COLORS = dict(zip(METHODS + BASELINES, ["black"] + [f"tab:{c}" for c in TAB]))
COLORS |= {a: COLORS[m] for a, (m, _, _) in ABLATIONS.items()} | {REFERENCE: "tab:gray"}

P1 = "pass1_after"  # the accuracy a run is read by, at T = EVAL_TEMPERATURE
# Each paper's claim: (method, what the paper says, the figure that measures it, the direction it claims). An
# accuracy claim is read at T = EVAL_TEMPERATURE and again at the run's own evaluation setting.
CLAIMS = [
    ("edge_grpo", "GEC gives all-equal groups a signal: fewer groups with zero advantage", "zero_adv", "lower"),
    ("edge_grpo", "GEC + EDA spread the advantages: larger within-group advantage variance", "adv_var", "higher"),
    ("edge_grpo", "higher accuracy", P1, "higher"),
    ("egpo", "calibration: its confidence separates right from wrong answers better", "auroc_after", "higher"),
    ("egpo", "higher accuracy", P1, "higher"),
    ("cw_grpo", "stable entropy: a smaller entropy change over training", "entropy_drift", "lower"),
    ("cw_grpo", "higher accuracy", P1, "higher"),
    ("pro_grpo", "exploration: higher policy entropy", "entropy_late", "higher"),
    ("pro_grpo", "diversity: higher pass@k at the largest k", "passmax_after", "higher"),
    ("pro_grpo", "higher accuracy", P1, "higher"),
    ("dapo", "higher accuracy", P1, "higher"),
    ("dr_grpo", "higher accuracy", P1, "higher"),
    ("gspo", "higher accuracy", P1, "higher"),
    ("kl_cov", "exploration: higher policy entropy", "entropy_late", "higher"),
    ("kl_cov", "higher accuracy", P1, "higher"),
    ("clip_cov", "exploration: higher policy entropy", "entropy_late", "higher"),
    ("clip_cov", "higher accuracy", P1, "higher"),
]
# Figures of the training, measured at a run's own sampling temperature: a method trained at another T than GRPO
# is read against its whole ablation (its own script and T), not against GRPO.
TRAINING_KEYS = {"entropy_late", "entropy_drift", "zero_adv", "adv_var"}
# Claims that cannot fail on this grid, and why (the page says so in one line, with no verdict).
UNTESTABLE = {
    ("edge_grpo", "zero_adv"): "true by construction against its ablation (GEC edits every wrong answer, so an "
    "all-wrong group gains right ones), and against GRPO confounded by its T = 0.6 and format reward",
    ("edge_grpo", "adv_var"): "true by construction: for std-normalised runs the within-group advantage variance "
    "is 1 minus the zero-advantage share (GEC lowers it, as above), and EDA divides the advantages by "
    "P_i / mean(P), which spreads them whatever they do; against GRPO confounded as above",
}


def method_of(run: str) -> str:
    """The method (or baseline) a run name belongs to: an ablation's own method, else the name itself."""
    return ABLATIONS[run][0] if run in ABLATIONS else run


@dataclass(frozen=True)
class Budget:
    """What every run of a grid is given: the model it trains, its steps, its optimiser steps per rollout, its
    held-out sums and samples per sum (fewer than EVAL_N: a quick check of the grid itself, pass@k up to k = eval_n),
    and whether it is evaluated at the methods' own settings too."""

    model: str = "smollm2"
    steps: int = STEPS
    eval_n: int = EVAL_N
    num_minibatches: int = 1
    held_out: int = 100
    own_settings: bool = True


@dataclass(frozen=True)
class Regime:
    """A grid's design: where it is stored, its budget and seeds, its ablations, run on the first `ablation_seeds`."""

    store: str
    budget: Budget
    seeds: tuple
    ablation_seeds: int
    ablations: tuple


# primary: 4 optimiser steps per rollout, the fewest the papers take (GSPO 4; Dr. GRPO and KL-Cov 8; DAPO and
# Pro-GRPO 16), so the ratio leaves 1 and the clip acts. 10 seeds, 300 held-out sums at 4 samples: seeds shrink
# the interval fastest per CPU-hour (docs/results_real.md, "What this design can tell"). No own-setting
# evaluations, and of the ablations only each method's whole one (its idea off): the rest is exploratory, and a run
# takes about 8 minutes (a TRL run about 20). on_policy: one step per rollout, as stored first.
REGIMES = {
    "primary": Regime("real_compare_primary", Budget(eval_n=4, num_minibatches=4, held_out=300, own_settings=False),
                      tuple(range(10)), 5, tuple(a for a in ABLATIONS if a.endswith("-off"))),
    "on_policy": Regime("real_compare", Budget(), SEEDS, len(SEEDS), tuple(ABLATIONS)),
}  # fmt: skip


def settings(run: str, seed: int, budget: Budget) -> dict:
    """What a stored run was made with; a stored run is reused only under the same."""
    steps = budget.steps
    evals = ["--eval_steps", str(steps), "--eval_n", str(budget.eval_n), "--eval_temperature", str(EVAL_TEMPERATURE)]
    if run != BASE:  # the policy before training is every run's: evaluated once per seed, in BASE's run
        evals += ["--eval_before", "false"]
    extra = ABLATIONS[run][1] if run in ABLATIONS else VARIANTS[run][1] if run in VARIANTS else []
    regime = [] if budget.num_minibatches == 1 else ["--num_minibatches", str(budget.num_minibatches)]
    held_out = {} if budget.held_out == 100 else {"held_out": budget.held_out}  # the on-policy runs predate it
    flags = FLAGS + regime + extra + evals
    return {"method": run, "seed": seed, "model": budget.model, "steps": steps, "flags": flags} | held_out


def own_setting(run: str) -> tuple | None:
    """The evaluation setting of a run's method (an ablation: its method's), or None: it has none here."""
    found = EVAL_SETTINGS.get(method_of(run))
    return found[0] if found else None


def eval_settings(run: str, runs: list, budget: Budget) -> list[tuple]:
    """The settings a run is evaluated at besides T = EVAL_TEMPERATURE: its own and those of the methods in `runs`
    that read it (GRPO: every one; a baseline: COMPARED_WITH); none where the budget has no own settings."""
    if not budget.own_settings:
        return []
    if run == BASE:
        readers = runs
    else:
        readers = [run, *(m for m, others in COMPARED_WITH.items() if run in others and m in runs)]
    return sorted({st for m in readers if (st := own_setting(m))})


def samples_at(setting: tuple, eval_n: int = EVAL_N) -> int:
    """Samples per problem at a setting: one when greedy (every sample would be the same), else `eval_n`."""
    return 1 if setting[0] == 0 else eval_n


def label(setting: tuple) -> str:
    """The stored samples' name of an evaluation at a setting, and its figures' suffix."""
    return "after-T{}-p{}".format(*setting)


def pass_key(k: int, setting: tuple | None) -> str:
    """The figure of held-out pass@k after training at a setting (None: at T = EVAL_TEMPERATURE)."""
    return f"pass{k}_after" if setting is None else f"pass{k}_{label(setting)}"


def setting_text(setting: tuple) -> str:
    t, top_p = setting
    return ("greedy" if t == 0 else f"T = {t}") + (f", top-p {top_p}" if top_p != 1.0 else "")


def whose_setting(run: str) -> str:
    """Whose evaluation setting a run's own is, in words ("its paper's (Sec. 4.2)", "the project's choice: ...")."""
    return EVAL_SETTINGS[method_of(run)][1]


def papers_setting(run: str) -> bool:
    """Is a run's own evaluation setting its method's paper's (not another project's, nor this project's choice)?"""
    return EVAL_SETTINGS[method_of(run)][2]
