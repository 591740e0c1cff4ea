#!/usr/bin/env python3
"""Where a test run's time went, from the JUnit reports of scripts/test.sh.

Usage: slowest-tests.py REPORT_DIR [N]

Prints, per report (fast-workspace, fast-cli, system, pytest, soak), how many tests ran and
their summed time; then the N slowest tests of all reports; and last a line of the form
`tests: P passed, F failed, S skipped` over every report.
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def cases(report: Path):
    """(name, seconds, outcome) of every test case in one JUnit file."""
    root = ET.parse(report).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        suite = case.get("classname", "")
        full = f"{suite}::{name}" if suite else name
        seconds = float(case.get("time") or 0.0)
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        yield full, seconds, outcome


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    folder = Path(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    reports = sorted(folder.glob("*.xml"))
    if not reports:
        print(f"no test reports in {folder}")
        return 0
    every = []
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    print(f"{'report':<16} {'tests':>6} {'test time':>10}")
    for report in reports:
        try:
            found = list(cases(report))
        except ET.ParseError as e:
            print(f"{report.stem:<16} unreadable report: {e}")
            continue
        for _, _, outcome in found:
            totals[outcome] += 1
        every.extend((report.stem, *c) for c in found)
        print(f"{report.stem:<16} {len(found):>6} {sum(s for _, s, _ in found):>9.0f}s")
    print(f"the {top} slowest tests:")
    for report, name, seconds, outcome in sorted(every, key=lambda c: -c[2])[:top]:
        mark = "" if outcome == "passed" else f"  ({outcome})"
        print(f"  {seconds:8.1f} s  {report}: {name}{mark}")
    failed = [(r, n) for r, n, _, o in every if o == "failed"]
    for report, name in failed:
        print(f"FAILED {report}: {name}")
    print(f"tests: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
