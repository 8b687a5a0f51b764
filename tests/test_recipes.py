"""recipes/: every paper setting the README gives is a recipe, and each one parses and validates."""

import importlib
import re

import pytest
import yaml
from train_utils import ROOT

from common.cli import parse_args
from common.prompts import TEMPLATE_CHOICES
from common.run_flags import RunFlags

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
README_COMMANDS = re.findall(  # on one line, or continued with a backslash; a baseline as baselines/<name>.py
    r"accelerate launch [^`\n]*? (?:baselines/)?(\w+)\.py(?: \\\n\s+| )--config (recipes/\S+\.yaml)",
    (ROOT / "README.md").read_text(),
)


def script_module(script: str):
    """A training script's module: grpo_base.py is `grpo_base`, baselines/gspo.py `baselines.gspo`."""
    return importlib.import_module(f"baselines.{script}" if (ROOT / "baselines" / f"{script}.py").is_file() else script)


def test_every_readme_paper_command_is_a_recipe():
    scripts = {script for script, _ in README_COMMANDS}
    assert {"grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo"} <= scripts, README_COMMANDS
    assert {ROOT / path for _, path in README_COMMANDS} == set(RECIPES)


@pytest.mark.parametrize(("script", "recipe"), README_COMMANDS)
def test_recipe_parses_into_its_script_flags_and_validates(script, recipe):
    module = script_module(script)
    args, run = parse_args(module.Args, RunFlags, argv=["--config", str(ROOT / recipe)])
    module.validate(args, run)
    assert args.lr in (1e-6, 5e-7) and args.model != "tiny" and args.template in TEMPLATE_CHOICES  # 5e-7: KL-Cov's 7B
    assert run.max_tokens_per_micro_batch > 0 and run.gradient_checkpointing
    override, _ = parse_args(module.Args, RunFlags, argv=["--config", str(ROOT / recipe), "--lr", "2e-6"])
    assert override.lr == 2e-6  # the command line wins


def test_a_bad_recipe_is_a_one_line_error(tmp_path):
    import grpo_base

    for text, message in [
        ("lr: 1.0e-6\nlearning_rate: 3\n", r"unknown flag\(s\) \['learning_rate'\]"),
        ("template: chatty\n", "template must be one of"),
        ("steps: many\n", "steps: invalid literal"),
        ("- lr\n", "must map flag names to values"),
    ]:
        (tmp_path / "r.yaml").write_text(text)
        with pytest.raises(SystemExit, match=message):
            parse_args(grpo_base.Args, RunFlags, argv=["--config", str(tmp_path / "r.yaml")])


# --- each page's "The paper's setting" table holds its recipe ------------------------------------

SETTING_COLUMNS = ["setting", "paper says", "recipe uses", "source"]
TABLE_FLAG = re.compile(r"`--(\w+) ([^`]+)`")  # `--lr 1e-6` in the "recipe uses" column
# Recipe keys about the machine, not the paper's setting: no row needed.
SYSTEM_KEYS = {"output_dir", "save_steps", "save_minutes", "gradient_checkpointing", "max_tokens_per_micro_batch", "vllm_sleep",
               "vllm_gpu_memory_utilization"}  # fmt: skip
METHODS = ["edge_grpo", "egpo", "cw_grpo", "pro_grpo", "dapo", "dr_grpo", "gspo", "kl_cov"]


def setting_table(script: str) -> list[dict]:
    """The rows of docs/algorithms/<script>.md's "The paper's setting" table, {column: cell}."""
    text = (ROOT / "docs" / "algorithms" / f"{script}.md").read_text()
    section = re.search(r"^#+ The paper's setting\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    assert section, f"docs/algorithms/{script}.md has no section 'The paper's setting'"
    lines = [line for line in section.group(1).splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == SETTING_COLUMNS, f"{script}.md: the table's columns are {header}, not {SETTING_COLUMNS}"
    rows = [
        dict(zip(header, (c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))))) for line in lines[2:]
    ]
    assert rows and all(len(r) == 4 and all(r.values()) for r in rows), f"{script}.md: a row lacks a cell"
    return rows


def recipe_of(script: str):
    (recipe,) = (ROOT / "recipes").glob(f"{script}_*.yaml")
    return recipe


def table_drift(script: str, recipe) -> list[str]:
    """Where the recipe (with the script's defaults) differs from the table's `--flag value` cells, and the
    recipe keys the table does not name."""
    module = script_module(script)
    stated = {}
    problems = []
    for row in setting_table(script):
        for flag, value in TABLE_FLAG.findall(row["recipe uses"]):
            if stated.setdefault(flag, value) != value:
                problems.append(f"the table gives --{flag} twice: {stated[flag]} and {value}")
    base = parse_args(module.Args, RunFlags, argv=["--config", str(recipe)])
    for flag, value in stated.items():
        with_table = parse_args(module.Args, RunFlags, argv=["--config", str(recipe), f"--{flag}", value])
        have = [getattr(part, flag) for part in base if hasattr(part, flag)]
        want = [getattr(part, flag) for part in with_table if hasattr(part, flag)]
        if have != want:
            problems.append(f"the table says --{flag} {value}, the recipe gives {have[0]!r}")
    keys = set(yaml.safe_load(recipe.read_text())) - SYSTEM_KEYS
    problems += [f"recipe key {k!r} is in no row of the table" for k in sorted(keys - set(stated))]
    return problems


@pytest.mark.parametrize("script", METHODS)
def test_the_papers_setting_table_holds_the_recipe(script):
    assert table_drift(script, recipe_of(script)) == []


def test_a_recipe_that_drifts_from_its_table_fails(tmp_path):
    recipe = tmp_path / "egpo_drifted.yaml"
    text = recipe_of("egpo").read_text()
    recipe.write_text(text.replace("group_size: 16", "group_size: 8") + "beta: 0.04\n")
    assert table_drift("egpo", recipe) == [
        "the table says --group_size 16, the recipe gives 8",
        "the table says --beta 0.0, the recipe gives 0.04",
    ]
    recipe.write_text(text + "seed: 3\n")
    assert table_drift("egpo", recipe) == ["recipe key 'seed' is in no row of the table"]


@pytest.mark.parametrize(
    ("recipe", "argv", "steps", "epochs"),
    [
        ("epochs: 5\n", ["--steps", "2"], 2, None),  # --steps beats the recipe's epochs
        ("epochs: 5\n", ["--step", "2"], 2, None),  # as argparse reads an abbreviation
        ("steps: 100\n", ["--epochs", "1"], 30, 1.0),  # --epochs beats the recipe's steps (back to the default)
        ("epochs: 5\n", ["--lr", "2e-6"], 30, 5.0),  # a recipe's own epochs stand when neither is given
        ("steps: 100\nepochs: 5\n", ["--steps", "7"], 7, None),
    ],
)
def test_command_line_steps_or_epochs_beat_the_recipes_other_one(tmp_path, recipe, argv, steps, epochs):
    import grpo_base

    (tmp_path / "r.yaml").write_text(recipe)
    args, _ = parse_args(grpo_base.Args, RunFlags, argv=["--config", str(tmp_path / "r.yaml"), *argv])
    assert (args.steps, args.epochs) == (steps, epochs)


def test_given_holds_the_flags_of_the_command_line_and_the_recipe(tmp_path):
    """tools.evaluate follows a run's own settings only where this command set none: `given` must be filled with a
    --config too (it was rebound inside parse_args, so a recipe left it empty and the run's settings won)."""
    from tools import evaluate as tool

    (tmp_path / "r.yaml").write_text("n: 2\n")
    given = set()
    args = parse_args(tool.Args, argv=["--config", str(tmp_path / "r.yaml"), "--template", "plain"], given=given)
    assert (args.n, args.template, given) == (2, "plain", {"n", "template"})
