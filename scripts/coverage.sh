#!/usr/bin/env bash
# Line and branch coverage of common/ and the five scripts under the CPU test suite, every Python process
# the tests start included (scripts/coverage.ini). Not part of CI: it runs the suite once more, slower.
#
#   bash scripts/coverage.sh                 # the whole suite (run it alone: ~10 min on 2 idle cores, more here)
#   bash scripts/coverage.sh -m "not slow"   # any pytest arguments
#   COVERAGE_APPEND=1 bash scripts/coverage.sh -m slow tests/test_engines.py   # adds to the last run's figures
#
# Prints the report (the missed lines of each file) and writes htmlcov/ and coverage.json under
# $TMPDIR/grpo-zoo-coverage/ (or COVERAGE_OUT). Exits with pytest's status; the report is written either way.
# What the CPU suite cannot execute, and why: docs/SCALING.md "Verified where".
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -c "import coverage, sys; sys.exit(coverage.version_info < (7, 10))" 2>/dev/null || {
    echo "scripts/coverage.sh: needs coverage.py >= 7.10 (pip install -r requirements-cpu.txt)" >&2
    exit 1
}
export COVERAGE_ROOT=$PWD
export COVERAGE_DATA_DIR=$(mkdir -p "${COVERAGE_OUT:-${TMPDIR:-/tmp}/grpo-zoo-coverage}" && cd "${COVERAGE_OUT:-${TMPDIR:-/tmp}/grpo-zoo-coverage}" && pwd)
APPEND=()
if [ "${COVERAGE_APPEND:-0}" = 1 ]; then
    APPEND=(--append) # add to the previous run's figures (the suite in parts, each run alone)
else
    rm -f "$COVERAGE_DATA_DIR"/.coverage*
fi
RC=scripts/coverage.ini
"$PY" -m coverage run --rcfile=$RC -m pytest "$@"
status=$?
"$PY" -m coverage combine --rcfile=$RC -q "${APPEND[@]}" "$COVERAGE_DATA_DIR"
"$PY" -m coverage report --rcfile=$RC
"$PY" -m coverage html --rcfile=$RC -q -d "$COVERAGE_DATA_DIR/htmlcov"
"$PY" -m coverage json --rcfile=$RC -q -o "$COVERAGE_DATA_DIR/coverage.json"
exit $status
