"""Writes ``tests/durations.json``, the seconds each slow test took, from a pytest run's
``--durations=0`` table: the order in which the test command's two workers take the tests
(``tests/conftest.py``, heaviest first, so both end together instead of one waiting out the
other's last long test).

    .venv/bin/python -m pytest -n 2 --dist worksteal --durations=0 -q > run.txt
    .venv/bin/python scripts/test_weights.py run.txt

Only an order: a stale or missing figure costs balance, never a result. Tests under
``MIN_S`` seconds are left out (they go last, in their own order).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_S = 3.0
LINE = re.compile(r"^(?P<s>[0-9.]+)s (?:setup|call|teardown)\s+(?P<id>tests/\S+)")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    seconds: dict[str, float] = defaultdict(float)
    for line in Path(argv[0]).read_text(errors="replace").splitlines():
        found = LINE.match(line.strip())
        if found:
            seconds[found["id"]] += float(found["s"])
    kept = {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]) if v >= MIN_S}
    if not kept:
        print(f"no durations table in {argv[0]} (run pytest with --durations=0)", file=sys.stderr)
        return 1
    (ROOT / "tests" / "durations.json").write_text(json.dumps(kept, indent=0) + "\n")
    print(f"tests/durations.json: {len(kept)} tests of {MIN_S:g} s or more, {sum(kept.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
