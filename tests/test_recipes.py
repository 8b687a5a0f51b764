"""recipes/: every paper setting the README gives is a recipe, and each one parses and validates."""

import importlib
import re

import pytest
from train_utils import ROOT

from common.cli import parse_args
from common.prompts import TEMPLATE_CHOICES
from common.run_flags import RunFlags

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
README_COMMANDS = re.findall(  # on one line, or continued with a backslash
    r"accelerate launch [^`\n]*? (\w+)\.py(?: \\\n\s+| )--config (recipes/\S+\.yaml)", (ROOT / "README.md").read_text()
)


def test_every_readme_paper_command_is_a_recipe():
    scripts = {script for script, _ in README_COMMANDS}
    assert scripts == {"grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo"}, README_COMMANDS
    assert {ROOT / path for _, path in README_COMMANDS} == set(RECIPES)


@pytest.mark.parametrize(("script", "recipe"), README_COMMANDS)
def test_recipe_parses_into_its_script_flags_and_validates(script, recipe):
    module = importlib.import_module(script)
    args, run = parse_args(module.Args, RunFlags, argv=["--config", str(ROOT / recipe)])
    module.validate(args, run)
    assert args.lr == 1e-6 and args.model != "tiny" and args.template in TEMPLATE_CHOICES
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
