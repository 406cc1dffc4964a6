"""Write tests/durations.json, the seconds each test took, from a run's JUnit report.

`make test-durations` runs the suite with `--junitxml` and then this; conftest.py orders the
units of work longest first by it. A report's testcase is `classname` (the module, dotted) and
`name`; its `time` holds setup, call and teardown."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).with_name("durations.json")


def durations(report: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        nodeid = f"{module}::{case.get('name')}"
        out[nodeid] = round(out.get(nodeid, 0.0) + float(case.get("time") or 0), 1)
    return dict(sorted(out.items()))


if __name__ == "__main__":
    measured = durations(Path(sys.argv[1]))
    OUT.write_text(json.dumps(measured, indent=0) + "\n")
    print(f"{OUT}: {len(measured)} tests, {sum(measured.values()):.0f} s")
