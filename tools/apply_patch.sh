#!/usr/bin/env bash
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
#
# Apply a paddle_overlay patch to a Paddle source tree, all or nothing.
#
# Usage: tools/apply_patch.sh PADDLE_SRC [PATCH]
#
#   PADDLE_SRC  a Paddle tree laid out as python/paddle/... (a checkout)
#   PATCH       default: the one file of patches/*.patch that applies to PADDLE_SRC
#
# Runs `git apply --check` first and applies only if it passes. git apply is atomic: when
# any hunk of any file does not apply, no file is changed. On a mismatch this script says
# which Paddle version the tree looks like, which committed patches would fit, and whether
# the patch is already applied.
#
# Exit codes: 0 applied, 1 does not apply (tree unchanged), 2 usage error.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
patches_dir=$root/patches
opt_rel=python/paddle/distributed/fleet/meta_optimizers/dygraph_optimizer

usage() {
    sed -n '4,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

die() {
    echo "error: $*" >&2
    exit 2
}

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

if [ -z "$patch" ]; then
    fitting=()
    while IFS= read -r p; do fits "$p" && fitting+=("$p"); done < <(committed_patches)
    if [ ${#fitting[@]} -eq 1 ]; then
        patch=${fitting[0]}
        echo "using ${patch#"$root"/} (the committed patch that applies to this tree)"
    fi
fi

if [ -n "$patch" ] && out=$(in_src apply --check "$patch" 2>&1); then
    in_src apply "$patch" || { echo "error: git apply failed after --check passed; see above" >&2; exit 1; }
    echo "applied ${patch#"$root"/} to $src:"
    in_src apply --stat "$patch"
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
            echo "The python/ part of ${p#"$root"/} fits, its test/ part does not (the tree has its own" >&2
            echo "test/collective/fleet files, e.g. upstream's dygraph_group_sharded_stage1_bf16.py)." >&2
            any=1
        fi
    done < <(committed_patches)
    echo "Make a patch for this exact tree (test files and registration included):" >&2
    echo "  python3 ${here#"$root"/}/make_patch.py --paddle-src $src --out paddle-stage1-broadcast-overlap.patch" >&2
    echo "  ${here#"$root"/}/apply_patch.sh $src paddle-stage1-broadcast-overlap.patch" >&2
fi
exit 1
