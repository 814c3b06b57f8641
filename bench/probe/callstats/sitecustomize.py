"""Times every call into the JVM (``pegaflow._bridge.Api.call``) of the Python processes that
start with this folder first on PYTHONPATH and CALLSTATS set (a folder): at exit each process
writes ``calls-<pid>.txt``, a line per call name (and whether it ran on the main thread): count,
mean, p50, p90 and max in microseconds. A probe for where a vLLM step's time in the connector goes
(docs/benchmarks/README.md, "Calls into the JVM per step"), e.g. on the build VM, with absolute
paths (the ttft worker runs in a folder of its own):

  CALLSTATS=/tmp/calls PYTHONPATH=$PWD/bench/probe/callstats:$PWD/python VLLM_ENABLE_V1_MULTIPROCESSING=0 \\
    <ci clone>/.venv-cpu-0.32/bin/python -m pegaflow.cli ttft --model <ci clone>/out/tiny-llama ...

Without CALLSTATS it changes nothing.
"""

import atexit
import collections
import os
import threading
import time

if os.environ.get("CALLSTATS"):
    import pegaflow._bridge as _b

    _stats = collections.defaultdict(list)
    _call = _b.Api.call

    def _timed(self, name, *args):
        t = time.perf_counter_ns()
        try:
            return _call(self, name, *args)
        finally:
            _stats[(name, threading.current_thread() is threading.main_thread())].append(time.perf_counter_ns() - t)

    _b.Api.call = _timed

    def _dump():
        path = os.path.join(os.environ["CALLSTATS"], f"calls-{os.getpid()}.txt")
        with open(path, "w") as f:
            for (name, main), d in sorted(_stats.items(), key=lambda kv: -sum(kv[1])):
                d.sort()
                n = len(d)
                f.write(f"{name:32s} main={main} n={n:6d} mean_us={sum(d) / n / 1e3:9.1f} p50_us={d[n // 2] / 1e3:8.1f} "
                        f"p90_us={d[int(n * 0.9)] / 1e3:8.1f} max_us={d[-1] / 1e3:9.1f}\n")

    atexit.register(_dump)
