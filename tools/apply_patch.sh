#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Apply a paddle_overlay patch to a Paddle source tree and register its tests, all or nothing.
#
# Usage: tools/apply_patch.sh [--no-register] PADDLE_SRC [PATCH]
#   PADDLE_SRC     a Paddle tree laid out as python/paddle/... (a checkout)
#   PATCH          default: the one file of patches/*.patch that applies to PADDLE_SRC
#   --no-register  apply the diff only (same as plain git apply)
#
# git apply --check, then git apply (atomic). Then the patch header's "testslist.csv row: " lines
# not in the tree yet are appended to test/collective/fleet/testslist.csv and the CMakeLists.txt
# beside it is regenerated with the tree's tools/gen_ut_cmakelists.py (this repository's if the
# tree has none) and cmake-format with the tree's .cmake-format.py; if a step fails the tree is
# put back. On a mismatch it says what the tree looks like, which committed patches fit, and
# whether the patch is applied already. PYTHON: interpreter for the generator (python3).
# Exit codes: 0 applied, 1 does not apply or registration failed (tree unchanged), 2 usage error.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
patches_dir=$root/patches
opt_rel=python/paddle/distributed/fleet/meta_optimizers/dygraph_optimizer
fleet_rel=test/collective/fleet
row_prefix='testslist.csv row: '
csv_header='name,os,arch,timeout,run_type,launcher,num_port,run_serial,envs,conditions'
python=${PYTHON:-python3}

usage() {
    sed -n '4,17s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

die() {
    echo "error: $*" >&2
    exit 2
}

register=1
if [ $# -ge 1 ] && [ "$1" = --no-register ]; then
    register=0
    shift
fi
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case $1 in -h | --help) usage ;; esac
[ -d "$1" ] || die "$1 is not a folder"
src=$(cd "$1" && pwd)
[ -d "$src/python/paddle" ] || die "$src is not a Paddle tree: no python/paddle folder"
patch=
if [ $# -eq 2 ]; then
    [ -f "$2" ] || die "patch $2 not found"
    patch=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
fi

# git in $src only, never in a repository above it: the patch paths are relative to $src.
in_src() { (cd "$src" && GIT_CEILING_DIRECTORIES=$(dirname "$src") git "$@"); }
fits() { in_src apply --check "$@" >/dev/null 2>&1; }

# What the tree looks like, one line per clue.
describe_tree() {
    local v dso=$src/$opt_rel/dygraph_sharding_optimizer.py
    if [ -f "$src/python/paddle/version/__init__.py" ]; then
        v=$(sed -n "s/^full_version *= *['\"]\([^'\"]*\)['\"].*/\1/p" "$src/python/paddle/version/__init__.py")
        [ -n "$v" ] && echo "  Paddle $v (python/paddle/version/__init__.py)"
    fi
    if v=$(in_src describe --tags --abbrev=0 2>/dev/null) && [ -n "$v" ]; then
        echo "  Paddle ${v#v} (nearest git tag $v)"
    fi
    if [ ! -f "$dso" ]; then
        echo "  no $opt_rel/dygraph_sharding_optimizer.py: not a Paddle 2.6+ tree"
    elif [ -f "$src/$opt_rel/broadcast_overlap.py" ] || grep -q '_origin_step' "$dso"; then
        echo "  already patched: has $opt_rel/broadcast_overlap.py or DygraphShardingOptimizer._origin_step"
    elif grep -q '_broadcast_order_params' "$dso"; then
        echo "  Paddle 3.x: dygraph_sharding_optimizer.py has upstream's broadcast overlap (PR #63945, _broadcast_order_params)"
    else
        echo "  Paddle 2.6: dygraph_sharding_optimizer.py has no upstream broadcast overlap"
    fi
}

committed_patches() { ls "$patches_dir"/*.patch 2>/dev/null; }

# The header rows of the patch ($1) whose test is not in the tree's testslist.csv yet.
new_rows() {
    local csv=$src/$fleet_rel/testslist.csv line name
    grep "^$row_prefix" "$1" | while IFS= read -r line; do
        line=${line#"$row_prefix"}
        name=${line%%,*}
        if [ -f "$csv" ] && cut -d, -f1 "$csv" | tr -d ' \r' | grep -qx "$name"; then
            continue
        fi
        printf '%s\n' "$line"
    done
}

# Append the rows and regenerate CMakeLists.txt; on failure put both files back. Needs
# $backup (a folder) and $rows (the lines to append).
register_tests() {
    local csv=$src/$fleet_rel/testslist.csv cmake=$src/$fleet_rel/CMakeLists.txt gen
    [ -f "$csv" ] && cp -p "$csv" "$backup/testslist.csv"
    [ -f "$cmake" ] && cp -p "$cmake" "$backup/CMakeLists.txt"
    if [ ! -f "$csv" ]; then
        printf '%s\n' "$csv_header" >"$csv"
    elif [ -n "$(tail -c1 "$csv")" ]; then
        echo >>"$csv"  # the last row had no newline
    fi
    printf '%s\n' "$rows" >>"$csv"
    if [ -f "$src/tools/gen_ut_cmakelists.py" ]; then
        gen=tools/gen_ut_cmakelists.py
        echo "regenerating $fleet_rel/CMakeLists.txt with the tree's $gen"
        (cd "$src" && "$python" "$gen" -f "$fleet_rel/testslist.csv") >"$backup/gen.log" 2>&1 || return 1
        format_cmake || return 1
    else
        echo "the tree has no tools/gen_ut_cmakelists.py: regenerating $fleet_rel/CMakeLists.txt with ${here#"$root"/}/gen_ut_cmakelists.py"
        "$python" "$here/gen_ut_cmakelists.py" -f "$csv" >"$backup/gen.log" 2>&1 || return 1
    fi
}

# cmake-format the regenerated CMakeLists.txt as Paddle's pre-commit does (upstream's generator
# writes it unformatted), with the tree's own .cmake-format.py; cmakelang through $python, else
# cmake-format on PATH; without either (or without the tree's config) say what to run.
format_cmake() {
    local file=$fleet_rel/CMakeLists.txt cfg
    cfg=$(ls "$src"/.cmake-format.py "$src"/.cmake-format.yaml "$src"/.cmake-format.json 2>/dev/null | head -1)
    if [ -z "$cfg" ]; then
        echo "note: the tree has no .cmake-format.py: $file is left as its generator wrote it"
    elif "$python" -c 'import cmakelang' >/dev/null 2>&1; then
        (cd "$src" && "$python" -m cmakelang.format -c "$cfg" -i "$file") >>"$backup/gen.log" 2>&1
    elif command -v cmake-format >/dev/null 2>&1; then
        (cd "$src" && cmake-format -c "$cfg" -i "$file") >>"$backup/gen.log" 2>&1
    else
        echo "note: no cmake-format here: run Paddle's pre-commit (cmake-format) on $file"
    fi
}

restore_registration() {
    local csv=$src/$fleet_rel/testslist.csv cmake=$src/$fleet_rel/CMakeLists.txt
    if [ -f "$backup/testslist.csv" ]; then cp -p "$backup/testslist.csv" "$csv"; else rm -f "$csv"; fi
    if [ -f "$backup/CMakeLists.txt" ]; then cp -p "$backup/CMakeLists.txt" "$cmake"; else rm -f "$cmake"; fi
}

if [ -z "$patch" ]; then
    fitting=()
    while IFS= read -r p; do fits "$p" && fitting+=("$p"); done < <(committed_patches)
    if [ ${#fitting[@]} -eq 1 ]; then
        patch=${fitting[0]}
        echo "using ${patch#"$root"/} (the committed patch that applies to this tree)"
    fi
fi

# Drivers import upstream's test base by the name the patch was made for; a later Paddle names
# it TestMultipleAccelerators. Refuse (changing nothing) rather than add drivers that cannot import.
legacy=$src/test/legacy_test/test_parallel_dygraph_dataparallel.py
if [ -n "$patch" ] && [ -f "$legacy" ] && ! grep -q '^class TestMultipleGpus\b' "$legacy" \
    && grep -q '^+from legacy_test.test_parallel_dygraph_dataparallel import TestMultipleGpus$' "$patch"; then
    echo "error: ${patch#"$root"/}'s drivers use TestMultipleGpus, which this tree's" >&2
    echo "test/legacy_test/test_parallel_dygraph_dataparallel.py does not define (a later Paddle names it" >&2
    echo "TestMultipleAccelerators); nothing was changed. Make a patch for this tree (its drivers follow the name):" >&2
    echo "  python3 ${here#"$root"/}/make_patch.py --paddle-src $src --out paddle-stage1-broadcast-overlap.patch" >&2
    echo "  ${here#"$root"/}/apply_patch.sh $src paddle-stage1-broadcast-overlap.patch" >&2
    exit 1
fi

if [ -n "$patch" ] && out=$(in_src apply --check "$patch" 2>&1); then
    rows=
    [ $register -eq 1 ] && rows=$(new_rows "$patch")
    in_src apply "$patch" || { echo "error: git apply failed after --check passed; see above" >&2; exit 1; }
    echo "applied ${patch#"$root"/} to $src:"
    in_src apply --stat "$patch"
    if [ -n "$rows" ]; then
        backup=$(mktemp -d)
        trap 'rm -rf "$backup"' EXIT
        if ! register_tests; then
            restore_registration
            in_src apply --reverse "$patch"
            echo "error: registering the tests failed; the tree is as it was (patch reverted):" >&2
            sed 's/^/  /' "$backup/gen.log" >&2
            exit 1
        fi
        echo "registered in $fleet_rel/testslist.csv and CMakeLists.txt:"
        printf '%s\n' "$rows" | cut -d, -f1 | sed 's/^/  /'
    fi
    exit 0
fi

# Mismatch: nothing was changed. Say why and what would fit.
if [ -n "$patch" ]; then
    echo "error: ${patch#"$root"/} does not apply to $src; nothing was changed (git apply is all-or-nothing)." >&2
    echo "git apply --check says:" >&2
    echo "$out" | head -20 | sed 's/^/  /' >&2
else
    echo "error: no committed patch in ${patches_dir#"$root"/}/ applies to $src; nothing was changed." >&2
fi
echo "The tree looks like:" >&2
describe_tree >&2
while IFS= read -r p; do
    if [ -n "$p" ] && fits --reverse "$p"; then
        echo "${p#"$root"/} is already applied to this tree (git apply --reverse --check passes)." >&2
        exit 1
    fi
done < <(if [ -n "$patch" ]; then echo "$patch"; else committed_patches; fi)
any=0
while IFS= read -r p; do
    if fits "$p"; then
        [ $any -eq 0 ] && echo "Patches that fit this tree (git apply --check passes):" >&2
        echo "  ${p#"$root"/}" >&2
        any=1
    fi
done < <(committed_patches)
if [ $any -eq 0 ]; then
    while IFS= read -r p; do
        if fits --include='python/*' "$p"; then
            echo "The python/ part of ${p#"$root"/} fits; a test file it adds is already in the tree" >&2
            echo "(git apply says which). Rename ours, or make a patch for this exact tree:" >&2
            any=1
        fi
    done < <(committed_patches)
    [ $any -eq 0 ] && echo "Make a patch for this exact tree (a checkout at another commit):" >&2
    echo "  python3 ${here#"$root"/}/make_patch.py --paddle-src $src --out paddle-stage1-broadcast-overlap.patch" >&2
    echo "  ${here#"$root"/}/apply_patch.sh $src paddle-stage1-broadcast-overlap.patch" >&2
fi
exit 1
