"""Markdown table (scenario x vLLM version -> result) from the JUnit files of ci/test-compat.sh."""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

folder = Path(sys.argv[1])
results: dict[str, dict[str, str]] = {}
versions = []
for xml in sorted(folder.glob("*.xml")):
    version = xml.stem
    versions.append(version)
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        results.setdefault(name, {})[version] = state
for err in sorted(folder.glob("*.error")):
    versions.append(err.stem)
    results.setdefault("venv", {})[err.stem] = "error: " + err.read_text().strip()
print("| scenario | " + " | ".join(versions) + " |")
print("|---|" + "---|" * len(versions))
for name in sorted(results):
    print(f"| {name} | " + " | ".join(results[name].get(v, "-") for v in versions) + " |")
