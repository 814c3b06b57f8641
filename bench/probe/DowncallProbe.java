import java.lang.foreign.*;
import java.lang.invoke.*;
import static java.lang.foreign.ValueLayout.*;
/**
 * What one driver call costs the JVM on the host, without a GPU: libc's int ffsl(long), bound
 * as the CUDA driver's calls are (cuEventQuery's shape), called through invokeWithArguments with
 * boxed arguments (how CudaDriver called every function before Downcall) and through a typed
 * invoke (Downcall's way). Prints per call, for three rounds of 2,000,000 calls each: ns and
 * bytes this thread allocated. Run with the options of the JVM inside vLLM:
 *   opts=$(PYTHONPATH=python python3 -c "from pegaflow._bridge import base_options; print(' '.join(base_options()))")
 *   java $opts bench/probe/DowncallProbe.java
 */
public class DowncallProbe {
    static final MethodHandle FFSL = Linker.nativeLinker().downcallHandle(
            Linker.nativeLinker().defaultLookup().find("ffsl").orElseThrow(), FunctionDescriptor.of(JAVA_INT, JAVA_LONG));

    static int boxed(MethodHandle h, Object... a) throws Throwable {
        return (int) h.invokeWithArguments(a);
    }

    static int typed(MethodHandle h, long a) throws Throwable {
        return (int) h.invoke(a);
    }

    public static void main(String[] x) throws Throwable {
        var threads = (com.sun.management.ThreadMXBean) java.lang.management.ManagementFactory.getThreadMXBean();
        long sink = 0;
        for (int round = 0; round < 3; round++) {
            for (String mode : new String[] {"invokeWithArguments", "typed_invoke"}) {
                int n = 2_000_000;
                long a0 = threads.getCurrentThreadAllocatedBytes(), t0 = System.nanoTime();
                for (int i = 0; i < n; i++) {
                    long v = 0x1_0000_0000L + i;
                    sink += mode.equals("typed_invoke") ? typed(FFSL, v) : boxed(FFSL, v);
                }
                long t = System.nanoTime() - t0, a = threads.getCurrentThreadAllocatedBytes() - a0;
                System.out.printf("{\"round\": %d, \"mode\": \"%s\", \"ns_per_call\": %.1f, \"bytes_per_call\": %.1f}%n",
                        round, mode, (double) t / n, (double) a / n);
            }
        }
        System.out.println("{\"sink\": " + sink + "}");
    }
}
