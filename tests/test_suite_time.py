"""benchmarks/suite_time.py reads pytest's output: the counts, the slowest calls, and every phase pytest printed
(setup and teardown too: a module's shared run is its first test's setup), where the next cut is looked for."""

import importlib.util

from train_utils import ROOT


def test_the_suite_timing_reads_pytests_counts_and_every_phase():
    spec = importlib.util.spec_from_file_location("suite_time", ROOT / "benchmarks" / "suite_time.py")
    suite_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite_time)
    output = """==== slowest durations ====
192.53s call     tests/test_a.py::test_x
5.75s setup    tests/test_b.py::test_y@faults
1.20s teardown tests/test_c.py::test_z[p-q]
2.00s call     tests/test_c.py::test_w
==== 2205 passed, 1 skipped in 1016.10s (0:16:56) ===="""
    record = suite_time.parse(output)
    assert record["counts"] == {"passed": 2205, "skipped": 1}
    assert [s["test"] for s in record["slowest"]] == ["tests/test_a.py::test_x", "tests/test_c.py::test_w"]
    assert [(p["phase"], p["seconds"]) for p in record["phases"]] == [
        ("call", 192.53),
        ("setup", 5.75),
        ("teardown", 1.2),
        ("call", 2.0),
    ]
