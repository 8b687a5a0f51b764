"""Tests for common/plot.py: the comparison figure, the results table, and refusing bad logs."""

import json

import pytest

from common import plot


def write_log(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def rows_for(method_key=None, steps=25, eval_every=None):
    rows = []
    for s in range(1, steps + 1):
        row = {
            "step": s,
            "time": 1000.0 + s,
            "train/reward": s / steps,
            "train/accuracy": s / steps,
            "train/entropy": None if s == 3 else 1.0 / s,
            "train/response_len": 40 + s,
            "train/zero_adv_group_frac": 0.5,
            "train/adv_var_within_group": 0.9,
            "train/lr": 1e-6,
            "time/rollout_s": 1.2,
            "reward/timeouts": 0,
            "train/epoch": 0,
        }
        if method_key:
            row[method_key] = 0.1 * s
        if eval_every and s % eval_every == 0:
            row |= {
                "eval/synthetic/pass@1": s / 50,
                "eval/synthetic/num_problems": 100,
                "eval/overall/pass@1": s / 50,
                "eval/mean/pass@1": s / 50,
            }
        rows.append(row)
    return rows


def test_plot_two_runs_writes_png_and_table(tmp_path, capsys):
    a = write_log(tmp_path / "grpo_base", rows_for(eval_every=10))
    b = write_log(tmp_path / "egpo", rows_for(method_key="egpo/w_mean"))
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
    assert "wrote" in capsys.readouterr().out


def test_panels_common_then_method_specific(tmp_path):
    runs = {"a": rows_for(method_key="edge/entropy_P", eval_every=5), "b": rows_for(method_key="egpo/w_mean")}
    panels = plot.choose_metrics(runs)
    assert panels[:6] == list(plot.COMMON)
    assert panels[6] == plot.EVAL_KEY
    assert panels[7:] == ["edge/entropy_P", "egpo/w_mean"]  # the methods' own namespaces; no timings, no bookkeeping
    assert plot.choose_metrics({"a": rows_for(method_key="cw/cov_mean")}) == [
        *plot.COMMON,
        "cw/cov_mean",
    ]  # one run: its own too
    many = {"a": [{"step": 1, **{f"pro/m{i}": 1.0 for i in range(10)}}], "b": [{"step": 1, "train/reward": 1.0}]}
    assert plot.choose_metrics(many, max_extra=3) == ["train/reward", "pro/m0", "pro/m1", "pro/m2"]


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
    assert plot.series(rows, "train/reward") == ([1, 2, 3], [0.1, 0.25, 0.3])
    assert plot.series(rows, "missing") == ([], [])
    assert plot.ema([1.0, 0.0, 0.0], 0.5) == [1.0, 0.5, 0.25]


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
        ('{"step": 1, "reward": 0.5}\n{"step": 2, "rew', ":2: malformed log line, not JSON"),
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
    assert not (tmp_path / "x.png").exists()


def test_refuses_missing_run_or_log(tmp_path):
    with pytest.raises(SystemExit, match="no such run directory"):
        plot.main([str(tmp_path / "nope"), "--output", str(tmp_path / "x.png")])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(SystemExit, match=r"empty_dir/metrics.jsonl: missing"):
        plot.main([str(tmp_path / "empty_dir"), "--output", str(tmp_path / "x.png")])


def test_refuses_malformed_eval_results(tmp_path):
    run = write_log(tmp_path / "r", rows_for())
    (run / "eval_results.json").write_text('{"config": {}}')
    with pytest.raises(SystemExit, match=r"eval_results.json: malformed, no \"summary\""):
        plot.main([str(run), "--output", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_table_without_eval_results_says_how_to_get_them():
    assert "No evaluation results" in plot.results_table({"a": None})


def test_a_cap_on_panels_leaves_every_method_one():
    runs = {
        "cw": [{"step": 1, **{f"cw/cov_{i}": 1.0 for i in range(8)}}],
        "egpo": [{"step": 1, "egpo/w_mean": 1.0, "egpo/w_max": 2.0}],
        "pro": [{"step": 1, "pro/conf_prompt": 0.5}],
    }
    assert plot.choose_metrics(runs, max_extra=4) == ["cw/cov_0", "egpo/w_max", "pro/conf_prompt", "cw/cov_1"]
