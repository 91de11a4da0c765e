#!/usr/bin/env python3
# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Check or fix, as Paddle's pre-commit would, the files the Paddle patch adds or changes (docs/patches.md).

black 23.3.0 and isort 5.12.0 with Paddle's settings, and upstream's Apache-2.0 header on every file
the patch adds whole (``--fix`` replaces a leading comment block mentioning ``Copyright``, keeping
its year, or inserts it). ``bash tools/format.sh [--check | --fix] [FILE...]``; exit codes: 0 clean
or fixed, 1 ``--check`` found files that would change, 2 black/isort missing or not pinned.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_patch  # noqa: E402

BLACK_VERSION = "23.3.0"
ISORT_VERSION = "5.12.0"
LINE_LENGTH = 80
HEADER_BODY = """\
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""
_COPYRIGHT_RE = re.compile(r"^# Copyright \(c\) (\d{4}) PaddlePaddle Authors\. All Rights Reserved\.\n")
_YEAR_RE = re.compile(r"Copyright[^0-9\n]*(\d{4})")
DEFAULT_YEAR = "2026"


class FormatToolError(Exception):
    """black or isort is missing or not the pinned version (message says how to install)."""


def formatters():
    """(black, isort) modules at the pinned versions; FormatToolError otherwise."""
    try:
        import black
        import isort
    except ImportError as e:
        raise FormatToolError(f"{e.name} is not installed: pip install black=={BLACK_VERSION} isort=={ISORT_VERSION} "
                              "(the [test] extra of this project pins both)") from None
    for module, want in ((black, BLACK_VERSION), (isort, ISORT_VERSION)):
        if module.__version__ != want:
            raise FormatToolError(f"{module.__name__} {module.__version__} found, {want} needed (Paddle's pin)")
    return black, isort


def has_header(text):
    m = _COPYRIGHT_RE.match(text)
    return bool(m) and text[m.end() :].startswith(HEADER_BODY)


def with_header(text):
    """``text`` with upstream's header instead of its leading copyright comment block, or before it."""
    if has_header(text):
        return text
    lines = text.splitlines(True)
    n = 0
    while n < len(lines) and lines[n].startswith("#"):
        n += 1
    block = "".join(lines[:n])
    year = DEFAULT_YEAR
    if "Copyright" in block:
        m = _YEAR_RE.search(block)
        year = m.group(1) if m else DEFAULT_YEAR
        lines = lines[n:]
    head = f"# Copyright (c) {year} PaddlePaddle Authors. All Rights Reserved.\n" + HEADER_BODY
    rest = "".join(lines)
    return head + ("" if rest.startswith("\n") or not rest else "\n") + rest


def formatted(text, path, header, fast=False):
    """``text`` as black, isort and (when ``header``) the header rule want it; ``fast``: without
    black's safety checks (the same text, about half the time)."""
    black, isort = formatters()
    text = with_header(text) if header else text
    config = isort.Config(profile="black", line_length=LINE_LENGTH, known_first_party=["paddle"], src_paths=())
    text = isort.code(text, config=config, file_path=None)
    try:
        return black.format_file_contents(
            text, fast=fast, mode=black.Mode(line_length=LINE_LENGTH, string_normalization=False))
    except black.NothingChanged:
        return text
    except black.InvalidInput as e:
        raise FormatToolError(f"{path}: black cannot parse it: {e}") from None


def run(paths, fix):
    """Check (or fix) ``paths`` (relative to ROOT or absolute); the paths that differ from their
    formatted text (before fixing). Raises FormatToolError."""
    whole = {os.path.join(make_patch.OVERLAY_DIR, n) for n in make_patch.NEW_MODULES}
    whole |= {os.path.join(make_patch.TEST_DIR, n) for n in make_patch.TEST_FILES}
    changed = []
    for path in paths:
        full = os.path.normpath(os.path.join(ROOT, path))
        with open(full, encoding="utf-8", newline="") as f:
            text = f.read()
        new = formatted(text, path, header=full in whole, fast=not fix)  # safety checks when writing
        if new != text:
            changed.append(path)
            if fix:
                with open(full, "w", encoding="utf-8", newline="") as f:
                    f.write(new)
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report only (default)")
    mode.add_argument("--fix", action="store_true", help="rewrite the files in place")
    parser.add_argument("files", nargs="*", help="default: every file the patch adds or changes")
    args = parser.parse_args(argv)
    paths = args.files or make_patch.patch_source_files()
    try:
        changed = run(paths, args.fix)
    except FormatToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    verb = "reformatted" if args.fix else "would reformat"
    for path in changed:
        print(f"{verb} {path}")
    print(f"{len(paths)} files checked (black {BLACK_VERSION}, isort {ISORT_VERSION}, Apache header), "
          f"{len(changed)} {verb}", file=sys.stderr)
    return 1 if changed and not args.fix else 0


if __name__ == "__main__":
    sys.exit(main())
