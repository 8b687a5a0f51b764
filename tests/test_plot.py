"""Tests for tools/plot.py: which panels, their titles, smoothing, the results table, and refusing bad input."""

import json
import subprocess
import sys

import matplotlib
import pytest

from tools import panels as plot_panels
from tools import plot

matplotlib.use("Agg")

EGPO_KEYS = ["egpo/entropy_proxy_correct", "egpo/w_at_lambda_min_frac", "egpo/w_mean"]


def write_log(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def rows_for(method_keys=(), steps=25, eval_every=None, reward_bonus=0.0):
    """A run's rows: every common metric, noisy enough that smoothing shows; reward = accuracy + reward_bonus."""
    rows = []
    for s in range(1, steps + 1):
        wiggle = 0.1 * (-1) ** s
        row = {
            "step": s,
            "time": 1000.0 + s,
            "train/reward": s / steps + wiggle + reward_bonus,
            "train/accuracy": s / steps + wiggle,
            "train/entropy": None if s == 3 else 1.0 / s,
            "train/response_len": 40 + s,
            "train/zero_adv_group_frac": 0.5,
            "train/adv_var_within_group": 0.9,
            "train/lr": 1e-6,
            "time/rollout_s": 1.2,
            "reward/timeouts": 0,
            "train/epoch": 0,
        }
        row |= {k: 0.1 * s for k in method_keys}
        if eval_every and s % eval_every == 0:
            row |= {
                "eval/synthetic/pass@1": s / 50,
                "eval/synthetic/num_problems": 100,
                "eval/overall/pass@1": s / 50,
                "eval/mean/pass@1": s / 50,
            }
        rows.append(row)
    return rows


def panels(fig):
    """{title: axes} of a figure's used panels."""
    return {ax.get_title(): ax for ax in fig.axes if ax.axison}


def test_plot_two_runs_writes_png_and_table(tmp_path, capsys):
    a = write_log(tmp_path / "grpo_base", rows_for(eval_every=10))
    b = write_log(tmp_path / "egpo", rows_for(EGPO_KEYS))
    (b / "eval_results.json").write_text(
        json.dumps(
            {
                "summary": {
                    "eval/math500/pass@1": 0.5,
                    "eval/math500/pass@4": 0.75,
                    "eval/math500/num_problems": 500,
                    "eval/overall/pass@1": 0.5,
                    "eval/overall/pass@4": 0.75,
                },
                "config": {},
            }
        )
    )
    png, table = tmp_path / "out" / "compare.png", tmp_path / "out" / "results.md"
    plot.main([str(a), str(b), "--output", str(png), "--table", str(table), "--smooth", "0.6"])

    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    md = table.read_text()
    assert "### pass@1 (%)" in md and "### pass@4 (%)" in md
    assert "| grpo_base | 50.0 | — | 50.0 | 50.0 | step 25 |" not in md  # last eval was step 20
    assert "| grpo_base | 40.0 | — | 40.0 | 40.0 | step 20 |" in md
    assert "| egpo | — | 50.0 | 50.0 | — | eval_results.json |" in md
    assert "math500 (500)" in md
    out = capsys.readouterr().out
    assert "wrote" in out and "(6 panels, 2 runs)" in out  # the common ones, reward = accuracy in one
    assert "3 method panels left out" in out and "--method_panels" in out


# ---------------------------------------------------------------------------
# Which panels
# ---------------------------------------------------------------------------


def test_two_methods_get_the_common_panels_only(capsys):
    runs = {"grpo_base": rows_for(eval_every=5), "egpo": rows_for(EGPO_KEYS)}
    assert plot.choose_metrics(runs) == [
        "train/accuracy",  # reward is accuracy here: one panel
        "eval/overall/pass@1",
        "train/entropy",
        "train/response_len",
        "train/zero_adv_group_frac",
        "train/adv_var_within_group",
    ]  # no timings, no bookkeeping, no method internals
    assert "(egpo, grpo)" in capsys.readouterr().out
    # Two methods that both log their own metrics: still one method's internals each.
    runs = {"cw": rows_for(["cw/cov_mean"]), "egpo": rows_for(EGPO_KEYS)}
    assert not any(k.startswith(("cw/", "egpo/")) for k in plot.choose_metrics(runs))


def test_one_method_gets_its_own_panels_after_the_common_ones():
    runs = {"egpo_c1": rows_for(EGPO_KEYS[::-1]), "egpo_c5": rows_for(EGPO_KEYS)}
    chosen = plot.choose_metrics(runs)
    assert chosen[:5] == ["train/accuracy", "train/entropy", "train/response_len", *plot_panels.COMMON[-2:]]
    assert chosen[5:] == EGPO_KEYS  # by name, whatever the logs' order
    assert plot.choose_metrics({"cw": rows_for(["cw/cov_mean"])})[-1] == "cw/cov_mean"  # one run: its own too
    # EDGE-GRPO logs edge/ and gec/: one method, whether or not a run logs GEC counts.
    edge = {"a": rows_for(["edge/entropy_P", "gec/fixed"]), "b": rows_for(["edge/entropy_P"])}
    assert plot.choose_metrics(edge)[-2:] == ["edge/entropy_P", "gec/fixed"]


def test_method_panels_flag_overrides_the_choice():
    two = {"grpo_base": rows_for(), "egpo": rows_for(EGPO_KEYS)}
    assert plot.choose_metrics(two, method_panels=True)[-3:] == EGPO_KEYS
    one = {"egpo": rows_for(EGPO_KEYS)}
    assert not any(k.startswith("egpo/") for k in plot.choose_metrics(one, method_panels=False))


def test_a_cap_on_method_panels_leaves_every_method_one(capsys):
    runs = {
        "cw": [{"step": 1, **{f"cw/cov_{i}": 1.0 for i in range(8)}}],
        "egpo": [{"step": 1, "egpo/w_mean": 1.0, "egpo/w_max": 2.0}],
        "pro": [{"step": 1, "pro/conf_prompt": 0.5}],
    }
    assert plot.choose_metrics(runs, method_panels=True, max_extra=4) == [
        "cw/cov_0",
        "egpo/w_max",
        "pro/conf_prompt",
        "cw/cov_1",
    ]
    assert "7 method metrics not plotted (--max_extra 4): egpo/w_mean" in capsys.readouterr().out


def test_reward_and_accuracy_share_a_panel_only_when_equal_in_every_run():
    same = {"a": rows_for(), "b": rows_for()}
    assert plot_panels.reward_is_accuracy(same)
    assert "train/reward" not in plot.choose_metrics(same)
    shaped = {"a": rows_for(), "b": rows_for(reward_bonus=0.1)}  # b's reward has a format bonus
    assert not plot_panels.reward_is_accuracy(shaped)
    assert plot.choose_metrics(shaped)[:2] == ["train/accuracy", "train/reward"]
    no_accuracy = {"a": [{"step": 1, "train/reward": 0.5}]}
    assert not plot_panels.reward_is_accuracy(no_accuracy) and plot.choose_metrics(no_accuracy) == ["train/reward"]

    titles = panels(plot_panels.figure(same, plot.choose_metrics(same)))
    assert "train/accuracy (= train/reward)" in titles and "train/reward" not in titles
    titles = panels(plot_panels.figure(shaped, plot.choose_metrics(shaped)))
    assert {"train/accuracy", "train/reward"} <= set(titles)


def test_metrics_flag_names_the_panels_in_order(tmp_path, capsys):
    runs = {"grpo_base": rows_for(), "egpo": rows_for(EGPO_KEYS)}
    assert plot.requested_metrics(runs, "train/entropy,egpo/*,train/accuracy") == [
        "train/entropy",
        *EGPO_KEYS,
        "train/accuracy",
    ]
    assert plot.requested_metrics(runs, "train/acuracy,train/lr") == ["train/lr"]
    assert "no run logs train/acuracy; did you mean train/accuracy?" in capsys.readouterr().out
    run = write_log(tmp_path / "r", rows_for())
    with pytest.raises(SystemExit, match=r"^error: --metrics nope/\*,x: no run logs any"):
        plot.main([str(run), "--metrics", "nope/*,x", "--output", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------
# Titles, labels, curves
# ---------------------------------------------------------------------------


def test_every_panel_is_titled_by_its_metric_key():
    runs = {"egpo": rows_for(EGPO_KEYS, eval_every=5), "egpo_c1": rows_for(EGPO_KEYS)}
    metrics = plot.choose_metrics(runs)
    fig = plot_panels.figure(runs, metrics)
    axes = panels(fig)
    assert list(axes) == ["train/accuracy (= train/reward)", *metrics[1:]]
    assert all(ax.get_xlabel() == "training step" for ax in axes.values())
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["egpo", "egpo_c1"]


def test_the_x_axis_names_what_it_shows():
    """Its values are metrics.jsonl's "step", a rollout batch (several optimiser steps with --mu or
    --num_minibatches): the axis said "optimiser step"."""
    ax = panels(plot_panels.figure({"a": rows_for(steps=5)}, ["train/accuracy"]))["train/accuracy (= train/reward)"]
    assert ax.get_xlabel() == "training step" and list(ax.get_lines()[-1].get_xdata()) == [1, 2, 3, 4, 5]


def test_training_curves_are_smoothed_by_default_raw_faint_behind():
    runs = {"a": rows_for(steps=200)}
    raw = plot_panels.series(runs["a"], "train/accuracy")[1]
    ax = panels(plot_panels.figure(runs, ["train/accuracy"]))["train/accuracy (= train/reward)"]
    faint, curve = ax.get_lines()
    assert list(faint.get_ydata()) == raw and faint.get_alpha() < 0.5
    assert list(curve.get_ydata()) == pytest.approx(plot_panels.ema(raw, plot_panels.auto_smoothing(200)))

    def roughness(ys):
        return sum(abs(b - a) for a, b in zip(ys, ys[1:]))

    assert roughness(list(curve.get_ydata())) < 0.3 * roughness(raw)
    # --smooth 0: the raw curve alone.
    (line,) = panels(plot_panels.figure(runs, ["train/accuracy"], smooth=0))[
        "train/accuracy (= train/reward)"
    ].get_lines()
    assert list(line.get_ydata()) == raw
    # The CLI's default is that automatic weight.
    assert plot.parse_args(plot.Args, argv=["run"]).smooth is None


def test_default_smoothing_is_light_for_short_runs_and_stronger_for_long():
    weights = [plot_panels.auto_smoothing(n) for n in (30, 80, 400, 1000, 4000, 100_000)]
    assert weights == pytest.approx([0.5, 0.5, 0.9, 0.96, 0.99, 0.99])
    assert plot_panels.ema([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])  # bias-corrected start
    assert plot_panels.ema([1.0, 0.0], 0.0) == [1.0, 0.0]


def test_eval_points_are_markers_not_smoothed_on_the_training_steps():
    runs = {"a": rows_for(steps=100, eval_every=10), "b": rows_for(steps=100, eval_every=10)}
    axes = panels(plot_panels.figure(runs, ["train/accuracy", plot_panels.EVAL_KEY]))
    lines = axes[plot_panels.EVAL_KEY].get_lines()
    assert len(lines) == 2  # one per run, no faint copy
    for line in lines:
        assert line.get_marker() == "o"
        assert list(line.get_xdata()) == list(range(10, 101, 10))
        assert list(line.get_ydata()) == pytest.approx([s / 50 for s in range(10, 101, 10)])
    assert axes[plot_panels.EVAL_KEY].get_xlim() == axes["train/accuracy (= train/reward)"].get_xlim()
    assert all(line.get_marker() in (None, "None", "") for line in axes["train/accuracy (= train/reward)"].get_lines())


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def test_series_skips_nulls_and_keeps_last_row_of_a_repeated_step(tmp_path):
    run = write_log(
        tmp_path / "r",
        [
            {"step": 1, "train/reward": 0.1},
            {"step": 2, "train/reward": None},
            {"step": 3, "train/reward": 0.3},
            {"step": 2, "train/reward": 0.25},
        ],
    )
    rows = plot.read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert plot_panels.series(rows, "train/reward") == ([1, 2, 3], [0.1, 0.25, 0.3])
    assert plot_panels.series(rows, "missing") == ([], [])


def test_a_torn_last_line_of_a_live_run_is_left_out(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "train/reward": 0.5}\n{"step": 2, "train/rew')
    assert [r["step"] for r in plot.read_metrics(run)] == [1]


def test_run_labels_disambiguate_equal_names(tmp_path):
    a = write_log(tmp_path / "seed0" / "grpo", rows_for())
    b = write_log(tmp_path / "seed1" / "grpo", rows_for())
    c = write_log(tmp_path / "egpo", rows_for())
    assert plot.run_labels([str(a), str(b), str(c / "metrics.jsonl")]) == ["seed0/grpo", "seed1/grpo", "egpo"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty log"),
        ("\n\n", "empty log"),
        ('{"step": 1, "rew\n{"step": 2, "reward": 0.5}\n', ":1: invalid JSON"),
        ("[1, 2]\n", ":1: malformed log line, expected a JSON object"),
        ('{"reward": 0.5}\n', ':1: malformed log line, no numeric "step"'),
        ('{"step": "one", "reward": 0.5}\n', ':1: malformed log line, no numeric "step"'),
    ],
)
def test_refuses_empty_or_malformed_log(tmp_path, content, message):
    good = write_log(tmp_path / "good", rows_for())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text(content)
    with pytest.raises(SystemExit) as exc:
        plot.main([str(good), str(bad), "--output", str(tmp_path / "x.png")])
    text = str(exc.value)
    assert text.startswith("error: ") and str(bad / "metrics.jsonl") in text and message in text
    assert "\n" not in text
    assert not (tmp_path / "x.png").exists()


def test_refuses_missing_run_or_log(tmp_path):
    with pytest.raises(SystemExit, match="no such run directory"):
        plot.main([str(tmp_path / "nope"), "--output", str(tmp_path / "x.png")])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(SystemExit, match=r"empty_dir/metrics.jsonl: missing"):
        plot.main([str(tmp_path / "empty_dir"), "--output", str(tmp_path / "x.png")])


def test_refuses_bad_flags_in_one_line(tmp_path):
    run = write_log(tmp_path / "r", rows_for())
    with pytest.raises(SystemExit, match=r"^error: --smooth must be >= 0, < 1 \(got 1\)$"):
        plot.main([str(run), "--smooth", "1"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match=r"^error: --output .*: cannot write"):
        plot.main([str(run), "--output", str(blocker / "x.png")])


def test_refuses_malformed_eval_results(tmp_path):
    run = write_log(tmp_path / "r", rows_for())
    (run / "eval_results.json").write_text('{"config": {}}')
    with pytest.raises(SystemExit, match=r"eval_results.json: malformed, no \"summary\""):
        plot.main([str(run), "--output", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_table_without_eval_results_says_how_to_get_them():
    assert "No evaluation results" in plot.results_table({"a": None})


def test_help_and_import_without_torch():
    code = "import sys; sys.modules['torch'] = None; sys.argv = ['plot', '--help']; import runpy; "
    code += "runpy.run_module('tools.plot', run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--method_panels" in out.stdout and "--smooth" in out.stdout and "runs" in out.stdout


def test_the_table_names_a_checkpoints_results(tmp_path):
    """eval_results.json of a checkpoint (tools.evaluate before it kept them apart) is reported as that checkpoint's."""
    run = write_log(tmp_path / "r", rows_for())
    summary = {"eval/overall/pass@1": 0.5}
    (run / "eval_results.json").write_text(json.dumps({"summary": summary, "config": {"checkpoint": "checkpoint-4"}}))
    assert plot.read_eval(run) == (summary, "eval_results.json (checkpoint-4)")
    old = {"summary": summary, "config": {"model_path": str(run / "checkpoint-4" / "model")}}
    (run / "eval_results.json").write_text(json.dumps(old))
    assert plot.read_eval(run) == (summary, "eval_results.json (checkpoint-4)")
    (run / "eval_results.json").write_text(json.dumps({"summary": summary, "config": {"step": 30}}))
    assert plot.read_eval(run) == (summary, "eval_results.json")


def test_the_default_figure_goes_beside_the_runs_not_into_the_repository(tmp_path, capsys):
    a = write_log(tmp_path / "runs" / "a", rows_for())
    b = write_log(tmp_path / "runs" / "b", rows_for())
    plot.main([str(a), str(b)])
    assert (tmp_path / "runs" / "compare.png").is_file()
    plot.main([str(a / "metrics.jsonl")])
    assert (a / "compare.png").is_file()
    assert f"wrote {a / 'compare.png'}" in capsys.readouterr().out
