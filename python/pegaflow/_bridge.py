"""The in-process JVM and the engine's C ABI, through ctypes only (no compiled extension).

``api()`` starts the JVM once per process, on first use: it loads ``libjvm.so`` of a Java
runtime >= 25 (``pegaflow._java.find_java``), creates the VM with the engine jar on its class
path, calls ``io.pegaflow.bridge.Bridge.bootstrap()`` through JNI and from then on calls the
``pegaflow_api`` table (``bridge/include/pegaflow.h``) as plain C functions. ctypes releases
the GIL for each call, and any Python thread may call: the JVM attaches it on first use.

Rules that keep the host process healthy (see ARCHITECTURE.md): ``-Xrs`` so Ctrl-C and
SIGTERM stay Python's; an explicit heap limit; the C locale is saved and restored around the
JVM's start; a process forked after the JVM started refuses to use it (the JVM's threads do
not survive fork) with a clear error instead of hanging; at exit every engine is closed,
waiting for its copies.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import locale
import os
import shlex
import subprocess
import tempfile
import threading
import time
from ctypes import CFUNCTYPE, POINTER, c_char_p, c_int32, c_int64, c_uint8, c_void_p
from pathlib import Path

from pegaflow._java import JVM_OPTIONS, JavaRuntime, find_jar, find_java
from pegaflow.errors import InvalidArgumentError, JvmStartError, from_code

ABI_VERSION = 9
JNI_VERSION_10 = 0x000A0000
# Offsets in JNIEnv's function table (checked against jni.h by tests/test_bridge_abi.py).
JNI_FIND_CLASS = 6
JNI_EXCEPTION_DESCRIBE = 16
JNI_EXCEPTION_CLEAR = 17
JNI_GET_STATIC_METHOD_ID = 113
JNI_CALL_STATIC_LONG_METHOD_A = 134
JNI_EXCEPTION_CHECK = 228

BOOTSTRAP_CLASS = b"io/pegaflow/bridge/Bridge"

# The table, in order: (name, argument types). Every function returns int32 (0 = ok).
EXPORTS: list[tuple[str, list]] = [
    ("last_error", [c_void_p, c_int32]),
    ("noop", []),
    ("engine_create", [c_char_p, c_int32, c_int64, c_int32, c_int32, c_int32, c_char_p, POINTER(c_int64)]),
    ("engine_close", [c_int64]),
    ("register_instance", [c_int64, c_char_p, c_char_p, c_int32, c_int32]),
    ("register_worker", [c_int64, c_char_p, c_int32, c_int32, c_int32, c_int32, c_char_p, c_void_p]),
    ("unregister_instance", [c_int64, c_char_p]),
    ("save", [c_int64, c_char_p, c_int32, c_int32, c_void_p, c_char_p, c_int32, c_char_p, c_int64, POINTER(c_int64)]),
    ("query", [c_int64, c_char_p, c_int32, c_char_p, c_int32, c_void_p, c_void_p]),
    ("load", [c_int64, c_char_p, c_int32, c_char_p, c_int32, c_void_p, POINTER(c_int64)]),
    ("release", [c_int64, c_char_p, c_char_p]),
    ("wait", [c_int64, c_int64, c_void_p]),
    ("poll", [c_int64, POINTER(c_int32)]),
    ("completion_free", [c_int64]),
    ("failed_blocks", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("stats", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("shutdown", []),
    ("engine_connect", [c_char_p, c_int32, c_int32, c_int32, c_int64, POINTER(c_int64)]),
    ("engine_server_id", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("link_open", [c_char_p, c_char_p, c_char_p, c_int32, c_int64, c_int64, c_char_p, POINTER(c_int64)]),
    ("link_register_worker", [c_int64, c_char_p, c_char_p, c_int32, c_int32, c_int32, c_int32, c_int32, c_int32,
                              c_int32, c_char_p, c_void_p]),
    ("link_unregister_instance", [c_int64, c_char_p]),
    ("link_status", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("link_stats", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("link_close", [c_int64]),
    ("sched_create", [c_int64, c_char_p, c_int32, c_int32, POINTER(c_int64)]),
    ("sched_lookup", [c_int64, c_char_p, c_char_p, c_int32, c_int32, c_int64, c_int64, POINTER(c_int64)]),
    ("sched_after_alloc", [c_int64, c_char_p, c_void_p, c_void_p, c_int32, c_int64]),
    ("sched_schedule", [c_int64, c_char_p, c_char_p, c_int32, c_int32, c_int32, c_void_p, c_void_p, c_int32, c_int32, c_int64, c_int64]),
    ("sched_preempted", [c_int64, c_char_p]),
    ("sched_build_plan", [c_int64, c_void_p, c_int64, POINTER(c_int64)]),
    ("sched_request_finished", [c_int64, c_char_p, POINTER(c_int32)]),
    ("sched_failed_blocks", [c_int64, c_void_p, c_int32]),
    ("sched_finished", [c_int64, c_char_p, c_char_p, c_char_p]),
    ("sched_close", [c_int64]),
    ("worker_create", [c_int64, c_char_p, c_int32, POINTER(c_int64)]),
    ("worker_start_loads", [c_int64, c_char_p, c_int64]),
    ("worker_submit_saves", [c_int64, c_char_p, c_int64, c_int64]),
    ("worker_await_preempted", [c_int64, c_char_p, c_int64]),
    ("worker_get_finished", [c_int64, c_char_p, c_void_p, c_int32, POINTER(c_int32)]),
    ("worker_load_errors", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("worker_close", [c_int64]),
    ("worker_stats", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("block_hashes", [c_char_p, c_char_p, c_char_p, c_int32, c_void_p, c_int64, c_int32, c_void_p, c_int64,
                      POINTER(c_int32), POINTER(c_int32)]),
    ("completion_on_done", [c_int64, c_void_p, c_void_p]),
    ("flush", [c_int64, c_int64]),
    ("query_request", [c_int64, c_char_p, c_char_p, c_int32, c_char_p, c_int32, c_int32, c_void_p, c_void_p]),
    ("query_cancel", [c_int64, c_char_p, c_char_p, c_void_p]),
    ("register_rank", [c_int64, c_char_p, c_char_p, c_int32, c_int32, c_int32, c_int32, c_int32, c_int32, c_char_p,
                       c_void_p]),
    ("worker_start_step_loads", [c_int64, c_char_p, c_int64, POINTER(c_int32)]),
    ("worker_wait_layer", [c_int64, c_int32, c_int64]),
    ("link_reset_cache", [c_int64, c_char_p, c_void_p]),
    ("link_kv_events", [c_int64, c_char_p, c_int64, c_int32, c_char_p, c_int32, POINTER(c_int32)]),
    ("link_demote", [c_int64, c_char_p, c_char_p, c_int32, c_int32, POINTER(c_int32)]),
    ("sched_lookup_tail", [c_int64, c_char_p, c_char_p, c_int32, c_int32, c_void_p, c_int32, c_int64, c_int64,
                           POINTER(c_int64)]),
    ("sched_stats", [c_int64, c_void_p, c_int32, POINTER(c_int32)]),
    ("tail_key", [c_char_p, c_int32, c_void_p, c_int32, c_void_p]),
    ("warm_up", [c_int32, POINTER(c_int32)]),
]
# The table's last entries an ABI 9 jar built before them lacks (hosts read function_count): bound
# where the jar has them, and their callers carry on without them (an optimisation each).
OPTIONAL = ("warm_up",)
assert [n for n, _ in EXPORTS[len(EXPORTS) - len(OPTIONAL):]] == list(OPTIONAL)


class _JavaVMOption(ctypes.Structure):
    _fields_ = [("optionString", c_char_p), ("extraInfo", c_void_p)]


class _JavaVMInitArgs(ctypes.Structure):
    _fields_ = [
        ("version", c_int32),
        ("nOptions", c_int32),
        ("options", POINTER(_JavaVMOption)),
        ("ignoreUnrecognized", c_uint8),
    ]


class Api:
    """The bound table: ``call(name, *args)`` raises the typed error of a non-zero code."""

    def __init__(self, table: int, jvm_start_ms: float):
        header = (ctypes.c_uint32 * 2).from_address(table)
        if header[0] != ABI_VERSION:
            raise JvmStartError(f"engine jar speaks C ABI version {header[0]}; this package expects {ABI_VERSION}")
        required = len(EXPORTS) - len(OPTIONAL)
        if header[1] < required:
            raise JvmStartError(f"engine table has {header[1]} functions; expected at least {required}")
        bound = min(int(header[1]), len(EXPORTS))
        pointers = (c_void_p * bound).from_address(table + 8)
        self.fns = {}
        for i, (name, argtypes) in enumerate(EXPORTS[:bound]):
            self.fns[name] = CFUNCTYPE(c_int32, *argtypes)(pointers[i])  # CFUNCTYPE: GIL released
        self.jvm_start_ms = jvm_start_ms
        self._err = threading.local()

    def last_error(self) -> str:
        buf = getattr(self._err, "buf", None)
        if buf is None:
            buf = self._err.buf = ctypes.create_string_buffer(4096)
        n = self.fns["last_error"](buf, len(buf))
        if n >= len(buf):
            buf = self._err.buf = ctypes.create_string_buffer(n + 1)
            self.fns["last_error"](buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def has(self, name: str) -> bool:
        """Whether the engine jar exports ``name`` (one of ``OPTIONAL``: an older jar may not)."""
        return name in self.fns

    def call(self, name: str, *args) -> None:
        _check_not_forked()
        fn = self.fns.get(name)
        if fn is None:
            raise InvalidArgumentError(f"the engine jar's table has no '{name}' (an older jar); "
                                       f"expected one built with this package")
        rc = fn(*args)
        if rc != 0:
            raise from_code(rc, self.last_error())


_lock = threading.Lock()
_api: Api | None = None
_jvm_pid: int | None = None
_forked_from: int | None = None


def _after_fork_in_child() -> None:
    global _forked_from
    if _jvm_pid is not None:
        _forked_from = _jvm_pid


def _check_not_forked() -> None:
    if _forked_from is not None:
        raise JvmStartError(
            f"this process was forked from pid {_forked_from} after that process started its JVM; the JVM's "
            "threads do not survive fork, so the engine cannot be used here. Start workers with "
            "multiprocessing's 'spawn' method (or start the engine only in the child)."
        )


JVM_OPTIONS_ENV = "PEGAFLOW_JVM_OPTIONS"


def extra_options() -> list[str]:
    """$PEGAFLOW_JVM_OPTIONS: more options for the in-process JVM, split as a shell would,
    after the defaults so they win (a larger heap, a collector, ``-Xlog:gc:file=...``)."""
    value = os.environ.get(JVM_OPTIONS_ENV, "")
    try:
        options = shlex.split(value)
    except ValueError as e:
        raise JvmStartError(f"{JVM_OPTIONS_ENV}={value!r}: {e}; expected JVM options split as a shell would") from e
    for o in options:
        if not o.startswith("-"):
            raise JvmStartError(f"{JVM_OPTIONS_ENV}={value!r}: {o!r} is not an option; expected JVM options "
                                "such as -Xmn64m (the class path and main class are the engine's)")
    return options


STAGING_YOUNG = ["-Xms192m", "-Xmn128m"]


def staging_options() -> list[str]:
    """A process that stages loads at their lookup ($PEGAFLOW_PRESTAGE_MIB > 0: a GPU's vLLM
    scheduler, whose staging buffer is GiBs of device memory) takes a young generation of 128
    MiB: with the 16 MiB heap's few MiB of eden, the serial collector stopped the staging thread
    as it laid out a 16K load's first group (docs/benchmarks/README.md, "Twenty-fourth to
    twenty-sixth GPU runs").
    Others keep the small heap (resident memory, docs/bridge.md)."""
    try:
        staging = int(os.environ.get("PEGAFLOW_PRESTAGE_MIB", "0") or 0) > 0
    except ValueError:
        staging = False  # the engine refuses the value, naming it
    return STAGING_YOUNG if staging else []


def base_options() -> list[str]:
    """JVM options of the in-process engine (and of its AOT training run: they must agree)."""
    error_file = Path(tempfile.gettempdir()) / "pegaflow-hs_err_pid%p.log"
    return [
        "-Xrs",  # leave SIGINT/SIGTERM/SIGQUIT to Python
        "-Xms16m",  # start small: eden is cycled through, so its size becomes resident memory
        "-Xmx512m",  # the pool is off-heap; the heap holds only metadata
        "-Xss2m",
        "-XX:+UseSerialGC",  # a small heap needs no parallel collector threads
        f"-XX:ErrorFile={error_file}",
        "-Xlog:aot=off",  # a stale AOT cache is skipped silently; it is rebuilt in the background
        "-Xlog:cds=off",
        *JVM_OPTIONS,
        *staging_options(),
        *extra_options(),
    ]


def cache_dir() -> Path:
    """Where per-machine artifacts live (AOT caches): $PEGAFLOW_CACHE_DIR or ~/.cache/pegaflow."""
    return Path(os.environ.get("PEGAFLOW_CACHE_DIR") or Path.home() / ".cache" / "pegaflow")


def aot_cache(runtime: JavaRuntime, jar: Path) -> Path:
    """The AOT cache for this runtime and jar (the JVM refuses a cache of another pair)."""
    st = jar.stat()
    key = f"{runtime.home}|{runtime.version}|{jar}|{st.st_size}|{st.st_mtime_ns}|{base_options()}"
    return cache_dir() / "aot" / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".aot")


def aot_for(runtime: JavaRuntime, jar: Path) -> Path | None:
    """The AOT cache this process's JVM uses and trains: none where $PEGAFLOW_JVM_OPTIONS adds
    options, since a cache the JVM finds unusable under them (a young generation larger than the
    initial heap, say) stops the JVM from starting, and with it the host process."""
    return None if extra_options() else aot_cache(runtime, jar)


def jvm_options(jar: Path, aot: Path | None = None) -> list[str]:
    aot_option = [f"-XX:AOTCache={aot}"] if aot is not None and aot.is_file() else []
    return [f"-Djava.class.path={jar}", *base_options(), *aot_option]


def train_aot_cache(runtime: JavaRuntime, jar: Path, wait: bool) -> Path:
    """Writes the AOT cache with a training run of Bridge.main (about a second of CPU).

    The cache shortens every later start of JVM plus table (docs/bridge.md, "Start time and
    the AOT cache"). The run writes to a temporary name and renames, so concurrent starts
    never read half a file."""
    target = aot_cache(runtime, jar)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.stem}.{os.getpid()}.tmp.aot")  # the JVM wants the .aot suffix
    cmd = [str(runtime.java), *base_options(), f"-XX:AOTCacheOutput={tmp}", "-cp", str(jar), "io.pegaflow.bridge.Bridge"]
    if wait:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.replace(tmp, target)
    else:
        shell = 't="$0"; f="$1"; shift; "$@" >/dev/null 2>&1 && mv -f "$t" "$f"; rm -f "$t" "$t.config"'
        subprocess.Popen(
            ["/bin/sh", "-c", shell, str(tmp), str(target), *cmd],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
    return target


def _start() -> Api:
    global _jvm_pid
    runtime = find_java()
    jar = find_jar()
    aot = aot_for(runtime, jar)
    libjvm = runtime.home / "lib" / "server" / "libjvm.so"
    if not libjvm.is_file():
        raise JvmStartError(f"{libjvm} not found in the Java runtime at {runtime.home} (from {runtime.source})")
    start = time.perf_counter()
    saved_locale = locale.setlocale(locale.LC_ALL)
    try:
        jvm = ctypes.CDLL(str(libjvm))
        options = [o.encode() for o in jvm_options(jar, aot)]
        opts = (_JavaVMOption * len(options))(*[_JavaVMOption(o, None) for o in options])
        args = _JavaVMInitArgs(JNI_VERSION_10, len(options), opts, 0)
        vm, env = c_void_p(), c_void_p()
        create = jvm.JNI_CreateJavaVM
        create.argtypes = [POINTER(c_void_p), POINTER(c_void_p), c_void_p]
        create.restype = c_int32
        rc = create(ctypes.byref(vm), ctypes.byref(env), ctypes.byref(args))
        if rc != 0:
            raise JvmStartError(
                f"JNI_CreateJavaVM failed with {rc} ({libjvm}); a process can start only one JVM, and "
                f"the options were {jvm_options(jar, aot)}"
            )
        table = _bootstrap(env.value)
    finally:
        locale.setlocale(locale.LC_ALL, saved_locale)
    _jvm_pid = os.getpid()
    elapsed = (time.perf_counter() - start) * 1000
    if aot is not None and not aot.is_file():
        try:
            train_aot_cache(runtime, jar, wait=False)
        except OSError:
            pass  # an unwritable cache directory only costs start time
    return Api(table, elapsed)


def _bootstrap(env: int) -> int:
    functions = ctypes.cast(ctypes.cast(env, POINTER(c_void_p))[0], POINTER(c_void_p))

    def jni(index: int, restype, *argtypes):
        return CFUNCTYPE(restype, c_void_p, *argtypes)(functions[index])

    find_class = jni(JNI_FIND_CLASS, c_void_p, c_char_p)
    get_static = jni(JNI_GET_STATIC_METHOD_ID, c_void_p, c_void_p, c_char_p, c_char_p)
    call_long = jni(JNI_CALL_STATIC_LONG_METHOD_A, c_int64, c_void_p, c_void_p, c_void_p)
    exception_check = jni(JNI_EXCEPTION_CHECK, c_uint8)
    exception_describe = jni(JNI_EXCEPTION_DESCRIBE, None)
    exception_clear = jni(JNI_EXCEPTION_CLEAR, None)

    def fail(what: str):
        if exception_check(env):
            exception_describe(env)  # prints the Java stack trace to stderr
            exception_clear(env)
        raise JvmStartError(f"{what} failed; is {find_jar()} an engine jar of this version?")

    cls = find_class(env, BOOTSTRAP_CLASS)
    if not cls:
        fail(f"FindClass({BOOTSTRAP_CLASS.decode()})")
    method = get_static(env, cls, b"bootstrap", b"()J")
    if not method:
        fail("GetStaticMethodID(bootstrap, ()J)")
    table = call_long(env, cls, method, None)
    if exception_check(env) or not table:
        fail("Bridge.bootstrap()")
    return table


def api() -> Api:
    """The engine's table, starting the JVM on first use (thread-safe, once per process)."""
    global _api
    _check_not_forked()
    if _api is None:
        with _lock:
            if _api is None:
                _api = _start()
                os.register_at_fork(after_in_child=_after_fork_in_child)
                atexit.register(_shutdown)
    return _api


def started() -> bool:
    return _api is not None


def _shutdown() -> None:
    if _api is not None and _forked_from is None:
        try:
            _api.call("shutdown")
        except Exception:  # noqa: BLE001 - nothing useful to do at interpreter exit
            pass


if __name__ == "__main__":
    # `python -m pegaflow._bridge` writes the AOT cache now unless it exists (make build runs it).
    _rt, _jar = find_java(), find_jar()
    _target = aot_cache(_rt, _jar)
    print(_target if _target.is_file() else train_aot_cache(_rt, _jar, wait=True))
