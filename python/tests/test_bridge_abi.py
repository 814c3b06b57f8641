"""The three descriptions of the C ABI agree: the header, the Python bindings, the JNI offsets."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pegaflow import _bridge

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "bridge" / "include" / "pegaflow.h"


def header_functions() -> list[tuple[str, int]]:
    body = HEADER.read_text()
    struct = body[body.index("typedef struct pegaflow_api {"): body.index("} pegaflow_api;")]
    out = []
    for name, args in re.findall(r"int32_t \(\*(\w+)\)\(([^;]*?)\);", struct, re.S):
        args = args.strip()
        out.append((name, 0 if args == "void" else args.count(",") + 1))
    return out


def test_python_table_matches_the_header():
    assert [(n, len(a)) for n, a in _bridge.EXPORTS] == header_functions()


def test_header_abi_version_matches():
    assert f"#define PEGAFLOW_ABI_VERSION {_bridge.ABI_VERSION}" in HEADER.read_text()


def test_jni_offsets_match_the_jdk_header():
    home = os.environ.get("JAVA_HOME") or "/usr/lib/jvm/temurin-25-jdk-amd64"
    jni_h = Path(home) / "include" / "jni.h"
    if not jni_h.is_file():
        pytest.skip(f"no JDK headers at {jni_h}")
    src = jni_h.read_text()
    body = src[src.index("struct JNINativeInterface_ {"):]
    body = body[: body.index("};")]
    entries = [a or b for a, b in re.findall(r"void \*(reserved\d)|\(JNICALL \*(\w+)\)", body)]
    assert entries.index("FindClass") == _bridge.JNI_FIND_CLASS
    assert entries.index("ExceptionDescribe") == _bridge.JNI_EXCEPTION_DESCRIBE
    assert entries.index("ExceptionClear") == _bridge.JNI_EXCEPTION_CLEAR
    assert entries.index("GetStaticMethodID") == _bridge.JNI_GET_STATIC_METHOD_ID
    assert entries.index("CallStaticLongMethodA") == _bridge.JNI_CALL_STATIC_LONG_METHOD_A
    assert entries.index("ExceptionCheck") == _bridge.JNI_EXCEPTION_CHECK


def test_error_codes_map_to_typed_exceptions():
    from pegaflow import errors

    assert isinstance(errors.from_code(3, "lease x is unknown"), errors.UnknownLeaseError)
    assert isinstance(errors.from_code(1, "bad"), ValueError)
    assert isinstance(errors.from_code(6, "full"), MemoryError)
    assert str(errors.from_code(2, "instance 'a' is not registered")) == "instance 'a' is not registered"
    assert isinstance(errors.from_code(99, "?"), errors.InternalError)


def test_an_older_abi_9_jar_without_the_optional_entries_is_bound_without_them():
    """A jar of ABI 9 built before the table's last (optional) entries: the package binds what
    it has and says clearly what it lacks; a table shorter than the required part is refused."""
    import ctypes

    from pegaflow import errors

    keep = ctypes.CFUNCTYPE(ctypes.c_int32)(lambda: 0)
    addr = ctypes.cast(keep, ctypes.c_void_p).value

    def table(count: int):
        buf = (ctypes.c_uint64 * (1 + count))()
        ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint32))[0] = _bridge.ABI_VERSION
        ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint32))[1] = count
        for i in range(count):
            buf[1 + i] = addr
        return buf

    required = len(_bridge.EXPORTS) - len(_bridge.OPTIONAL)
    older = table(required)
    api = _bridge.Api(ctypes.addressof(older), 0.0)
    assert not api.has("warm_up") and api.has("tail_key")
    with pytest.raises(errors.InvalidArgumentError, match="no 'warm_up' .*an older jar"):
        api.call("warm_up", 16, None)
    newer = table(len(_bridge.EXPORTS) + 3)  # a later jar's longer table: bound up to what the package knows
    assert _bridge.Api(ctypes.addressof(newer), 0.0).has("warm_up")
    short = table(required - 1)
    with pytest.raises(errors.JvmStartError, match=f"expected at least {required}"):
        _bridge.Api(ctypes.addressof(short), 0.0)
