"""The README's release table says what PADDLE_PINS holds (the one table the test venvs install)."""

import os
import re

from paddle_overlay._patching import PADDLE_PINS, TESTED_PADDLE

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def readme_pins():
    """{version: set of pins} from the README table's rows (``3.0.0 to 3.3.0`` covers a range)."""
    text = open(README).read()
    table = text[text.index("| Paddle | pin |"):].split("\n\n")[0].splitlines()[2:]
    found = {}
    for row in table:
        first, pins = [cell.strip() for cell in row.strip("|").split("|")[:2]]
        versions = re.findall(r"\d+\.\d+\.\d+", first)
        if " to " in first:
            lo, hi = (TESTED_PADDLE.index(v) for v in versions)
            versions = TESTED_PADDLE[lo : hi + 1]
        for version in versions:
            found[version] = set(re.findall(r"`([^`]+)`", pins.split("(")[0]))
    return found


def test_readme_table_matches_the_pins():
    assert readme_pins() == {v: set(PADDLE_PINS[v]) for v in TESTED_PADDLE}


def test_every_tested_release_has_pins():
    assert list(PADDLE_PINS) == list(TESTED_PADDLE)
