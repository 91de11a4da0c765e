#!/bin/bash
# Stand-in for upstream's test/legacy_test/dist_test.sh: runs the unittest named
# by $TEST_TARGET_NAME (or $1) from the current folder and returns its status.
name=${TEST_TARGET_NAME:-${1:-}}
[ -n "$name" ] || { echo "usage: dist_test.sh TEST_NAME" >&2; exit 2; }
python -u -m unittest "$name"
