"""Engine error codes agree across Java (``ErrorCode.java``), C (``pegaflow.h``, ``enum
pf_error``) and Python (``pegaflow.errors``). Unit tier: reads the two sources as text, no JVM.

Java's ``X_Y`` is the C header's ``PF_X_Y`` and Python's ``XYError``, except where the Python
name says more (``RENAMED``). ``OK`` (0) is not an error: Java and C have it, Python has no class.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pegaflow import errors

ROOT = Path(__file__).resolve().parents[2]  # python/tests/ -> repository root
JAVA = ROOT / "jvm-engine" / "src" / "main" / "java" / "io" / "pegaflow" / "engine" / "ErrorCode.java"
HEADER = ROOT / "bridge" / "include" / "pegaflow.h"

# Java name -> Python class name, where the rule X_Y -> XYError does not give it.
RENAMED = {
    "CLOSED": "EngineClosedError",
    "TIMEOUT": "EngineTimeoutError",
    "UNAVAILABLE": "ServerUnavailableError",
}
NOT_AN_ERROR = "OK"


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def _read(path: Path) -> str:
    if not path.is_file():
        pytest.fail(f"{path} not found (the test reads it relative to {Path(__file__).name}: "
                    f"repository root {ROOT})")
    return path.read_text()


def _unique(pairs: list[tuple[str, int]], where: str) -> dict[str, int]:
    names = [n for n, _ in pairs]
    dup_names = sorted({n for n in names if names.count(n) > 1})
    values = [v for _, v in pairs]
    dup_values = sorted({v for v in values if values.count(v) > 1})
    assert not dup_names, f"{where}: names defined twice: {dup_names}"
    assert not dup_values, f"{where}: values used twice: " + ", ".join(
        f"{v} by {[n for n, x in pairs if x == v]}" for v in dup_values)
    return dict(pairs)


def java_codes() -> dict[str, int]:
    """The constants of ``enum ErrorCode`` with their constructor arguments."""
    text = _strip_comments(_read(JAVA))
    m = re.search(r"\benum\s+ErrorCode\s*\{(.*?);", text, flags=re.S)
    assert m, f"{JAVA}: no 'enum ErrorCode {{ ... ;' found"
    body = m.group(1)
    entries = [e.strip() for e in body.split(",") if e.strip()]
    pairs = []
    for e in entries:
        em = re.fullmatch(r"([A-Z][A-Z0-9_]*)\s*\(\s*(-?\d+)\s*\)", e)
        assert em, f"{JAVA}: enum constant {e!r} is not NAME(value)"
        pairs.append((em.group(1), int(em.group(2))))
    return _unique(pairs, str(JAVA))


def header_codes() -> dict[str, int]:
    """``enum pf_error``'s enumerators without the ``PF_`` prefix (implicit values counted as C does)."""
    text = _strip_comments(_read(HEADER))
    m = re.search(r"\benum\s+pf_error\s*\{(.*?)\}", text, flags=re.S)
    assert m, f"{HEADER}: no 'enum pf_error {{ ... }}' found"
    pairs, nxt = [], 0
    for e in (e.strip() for e in m.group(1).split(",")):
        if not e:
            continue
        em = re.fullmatch(r"PF_([A-Z][A-Z0-9_]*)\s*(?:=\s*(-?\d+))?", e)
        assert em, f"{HEADER}: enumerator {e!r} is not PF_NAME [= value]"
        value = int(em.group(2)) if em.group(2) is not None else nxt
        pairs.append((em.group(1), value))
        nxt = value + 1
    return _unique(pairs, f"{HEADER} enum pf_error")


def python_codes() -> dict[str, int]:
    """Every class in ``pegaflow.errors`` that declares its own engine code."""
    pairs = [
        (name, obj.__dict__["code"])
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, errors.PegaflowError)
        and obj is not errors.PegaflowError and "code" in obj.__dict__
    ]
    return _unique(pairs, "pegaflow.errors")


def python_name(java_name: str) -> str:
    return RENAMED.get(java_name) or "".join(p.capitalize() for p in java_name.split("_")) + "Error"


def test_sources_are_parsed():
    java, c = java_codes(), header_codes()
    assert java.get(NOT_AN_ERROR) == 0, f"{JAVA}: OK(0) missing: {java}"
    assert c.get(NOT_AN_ERROR) == 0, f"{HEADER}: PF_OK = 0 missing: {c}"
    assert len(java) > 5 and len(c) > 5 and len(python_codes()) > 5


def test_java_and_c_header_agree():
    java, c = java_codes(), header_codes()
    problems = [f"{n}: Java {n}({java[n]}) but C PF_{n} = {c[n]}" for n in sorted(java.keys() & c.keys())
                if java[n] != c[n]]
    problems += [f"{n}: in Java ({java[n]}) but no PF_{n} in {HEADER.name}" for n in sorted(java.keys() - c.keys())]
    problems += [f"PF_{n}: in {HEADER.name} ({c[n]}) but not in ErrorCode.java" for n in sorted(c.keys() - java.keys())]
    assert not problems, "error codes differ between Java and C:\n  " + "\n  ".join(problems)


def test_java_and_python_agree():
    java, py = java_codes(), python_codes()
    expected = {python_name(n): (n, v) for n, v in java.items() if n != NOT_AN_ERROR}
    problems = []
    for cls, (n, v) in sorted(expected.items(), key=lambda kv: kv[1][1]):
        if cls not in py:
            problems.append(f"{n}({v}): no pegaflow.errors.{cls} with code = {v}")
        elif py[cls] != v:
            problems.append(f"{n}: Java {n}({v}) but pegaflow.errors.{cls}.code = {py[cls]}")
    for cls in sorted(py.keys() - expected.keys()):
        problems.append(f"pegaflow.errors.{cls} (code {py[cls]}) has no Java ErrorCode "
                        f"(expected one of {sorted(expected)}; add it to RENAMED if the name differs)")
    assert not problems, "error codes differ between Java and Python:\n  " + "\n  ".join(problems)


def test_python_maps_every_engine_code_to_its_class():
    java = java_codes()
    problems = []
    for n, v in sorted(java.items(), key=lambda kv: kv[1]):
        if n == NOT_AN_ERROR:
            assert v not in errors.BY_CODE, f"pegaflow.errors.BY_CODE maps OK ({v}) to {errors.BY_CODE[v].__name__}"
            continue
        cls = errors.BY_CODE.get(v)
        if cls is None or cls.__name__ != python_name(n):
            problems.append(f"{n}({v}): BY_CODE[{v}] is {cls.__name__ if cls else None}, expected {python_name(n)}")
        elif not (type(err := errors.from_code(v, "m")) is cls and err.code == v):
            problems.append(f"{n}({v}): from_code({v}) gave {type(err).__name__} code {err.code}")
    extra = sorted(set(errors.BY_CODE) - set(java.values()))
    if extra:
        problems.append(f"BY_CODE has codes Java does not define: {extra}")
    assert not problems, "pegaflow.errors.BY_CODE / from_code disagree with Java:\n  " + "\n  ".join(problems)
