import io.pegaflow.engine.cuda.CudaDriver;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;

/**
 * When does the copy engine start a pitched host-to-device copy queued after the GPU idled? A
 * warm 8K request traced with vLLM's CUDA graphs (33rd GPU run) showed the staging's first copy
 * later than the staging thread's counters put it queued, and never before vLLM's step had begun
 * (the 34th run found the trace's clock at fault: docs/gpu.md); this asks the driver alone, no
 * vLLM, no engine. Registered host memory (page-aligned,
 * cuMemHostRegister, as the pool is) and a device buffer; a copy of two pitched 16 MiB halves
 * (512 rows of 32 KiB, as a staging's first layer group at 8K) on a non-blocking stream of a
 * thread of its own (the staging thread's place), then an event; the host times, from just
 * before the first cuMemcpy2DAsync: the queueing calls' return, and the event seen complete
 * (spinning on cuEventQuery, as the staging thread does). Cases, 15 rounds each, p50/min/max µs:
 *   back_to_back      - no idle before the copy;
 *   idle_5ms, idle_50ms, after_idle - 5, 50 and 600 ms with nothing on the GPU first (a warm
 *                       request comes tens to hundreds of ms after the one before);
 *   after_idle_kick   - 600 ms, and 200 µs after queueing, another thread (vLLM's place) queues
 *                       a 4-byte copy on another stream: does the first copy wait for it?
 *   after_idle_prewake - 600 ms, then a 4-byte copy on the same stream 500 µs before the copy
 *                       (as a lookup could send before its staging is laid out);
 *   after_idle_1d     - 600 ms, then the same bytes as 1,024 one-dimensional 32 KiB copies;
 *   tiny_after_idle   - 600 ms, then the 4-byte copy alone: the driver's and engine's start;
 *   pool_shape_back_to_back, pool_shape_after_idle - a staging's first layer as it is at 8K: 512
 *                       slots of 2 MiB (32 layers of K and V) in 1 GiB registered as two 512 MiB
 *                       pieces, the layer's 64 KiB rows at a pitch of 2 MiB, so two pitched copies
 *                       of 256 rows split where the registrations meet (one copy may not span
 *                       two): how long queueing them takes, beside the staging counters' time
 *                       for a first layer's layout and copies (docs/gpu.md).
 * A copy that starts as queued lands one copy time after it (32 MiB at the line); one that lands
 * about 200 µs later only in the kick case waited for the other thread's call.
 * Needs a GPU; compile on the build machine into .gpu-tests/probe and run there with the wheel's runtime:
 *   javac -d .gpu-tests/probe -cp bench/target/pegaflow.jar bench/probe/FirstCopyProbe.java
 *   /tmp/ours-site/pegaflow/_jre/bin/java --enable-native-access=ALL-UNNAMED \
 *     -cp /tmp/ours-site/pegaflow/_jars/pegaflow.jar:.gpu-tests/probe FirstCopyProbe
 */
public class FirstCopyProbe {
    static final long ROW = 32 << 10, ROWS = 512, HALF = ROW * ROWS, PITCH = 2 * ROW;

    public static void main(String[] args) throws Exception {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 15;
        CudaDriver.ensureLoaded();
        long ctx = CudaDriver.primaryCtxRetain(CudaDriver.deviceGet(0));
        CudaDriver.ctxSetCurrent(ctx);
        Arena arena = Arena.global();
        // the pool's shape: host memory registered with the driver, rows at a pitch of two
        MemorySegment host = arena.allocate(2 * PITCH * ROWS, 4096);
        host.fill((byte) 1);
        CudaDriver.memHostRegister(host.address(), host.byteSize(), CudaDriver.CU_MEMHOSTREGISTER_PORTABLE);
        long dev = CudaDriver.memAlloc(2 * HALF);
        // the pool's own shape: 512 slots of 2 MiB, registered in two halves as the pool's chunks are
        long slot = 2L << 20, slots = 512, registration = slots * slot / 2;
        MemorySegment pool = arena.allocate(slots * slot, 4096);
        pool.fill((byte) 2);
        CudaDriver.memHostRegister(pool.address(), registration, CudaDriver.CU_MEMHOSTREGISTER_PORTABLE);
        CudaDriver.memHostRegister(pool.address() + registration, registration, CudaDriver.CU_MEMHOSTREGISTER_PORTABLE);
        long small = CudaDriver.memAlloc(64);
        long smallHost = CudaDriver.memAllocHost(64);
        MemorySegment desc = arena.allocate(CudaDriver.MEMCPY2D_BYTES, 8);
        long[] stream = new long[1];
        long[] other = new long[1];
        long done = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
        Thread setup = new Thread(() -> {
            CudaDriver.ctxSetCurrent(ctx);
            stream[0] = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
            other[0] = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
        });
        setup.start();
        setup.join();
        for (String mode : new String[] {"back_to_back", "idle_5ms", "idle_50ms", "after_idle", "after_idle_kick",
                "after_idle_prewake", "after_idle_1d", "tiny_after_idle", "pool_shape_back_to_back", "pool_shape_after_idle",
                "back_to_back"}) {
            long[] queued = new long[rounds];
            long[] landed = new long[rounds];
            for (int r = 0; r < rounds + 2; r++) { // two rounds first, not counted
                if (mode.equals("idle_5ms")) {
                    Thread.sleep(5);
                } else if (mode.equals("idle_50ms")) {
                    Thread.sleep(50);
                } else if (mode.contains("after_idle")) {
                    Thread.sleep(600);
                }
                if (mode.endsWith("prewake")) {
                    CudaDriver.memcpyHtoDAsync(small, smallHost, 4, stream[0]);
                    long w = System.nanoTime();
                    while (System.nanoTime() - w < 500_000) {
                        Thread.onSpinWait();
                    }
                }
                long[] t = new long[2];
                Thread kicker = null;
                long t0 = System.nanoTime();
                if (mode.endsWith("kick")) {
                    kicker = new Thread(() -> {
                        CudaDriver.ctxSetCurrent(ctx);
                        while (System.nanoTime() - t0 < 200_000) {
                            Thread.onSpinWait();
                        }
                        CudaDriver.memcpyHtoDAsync(small, smallHost, 4, other[0]);
                    });
                    kicker.start();
                }
                Thread stager = new Thread(() -> {
                    CudaDriver.ctxSetCurrent(ctx);
                    long s = System.nanoTime();
                    if (mode.startsWith("tiny")) {
                        CudaDriver.memcpyHtoDAsync(small, smallHost, 4, stream[0]);
                    } else if (mode.startsWith("pool_shape")) {
                        for (long half = 0; half < 2; half++) { // layer 0's rows of slots 0-255, then 256-511
                            CudaDriver.memcpy2DHtoDAsync(desc, dev + half * (slots / 2) * 2 * ROW, 2 * ROW,
                                    pool.address() + half * registration, slot, 2 * ROW, slots / 2, stream[0]);
                        }
                    } else if (mode.endsWith("1d")) {
                        for (int half = 0; half < 2; half++) {
                            for (long row = 0; row < ROWS; row++) {
                                CudaDriver.memcpyHtoDAsync(dev + half * HALF + row * ROW,
                                        host.address() + half * ROW + row * PITCH, ROW, stream[0]);
                            }
                        }
                    } else {
                        for (int half = 0; half < 2; half++) {
                            CudaDriver.memcpy2DHtoDAsync(desc, dev + half * HALF, ROW, host.address() + half * ROW, PITCH, ROW,
                                    ROWS, stream[0]);
                        }
                    }
                    CudaDriver.eventRecord(done, stream[0]);
                    t[0] = System.nanoTime() - s;
                    while (!CudaDriver.eventQuery(done)) {
                        Thread.onSpinWait();
                    }
                    t[1] = System.nanoTime() - s;
                });
                stager.start();
                stager.join();
                if (kicker != null) {
                    kicker.join();
                }
                CudaDriver.streamSynchronize(other[0]);
                if (r >= 2) {
                    queued[r - 2] = t[0];
                    landed[r - 2] = t[1];
                }
            }
            System.out.printf("{\"mode\": \"%s\", \"queued_us\": %s, \"landed_us\": %s}%n", mode, stats(queued), stats(landed));
        }
        CudaDriver.memHostUnregister(host.address());
        CudaDriver.memHostUnregister(pool.address());
        CudaDriver.memHostUnregister(pool.address() + registration);
        CudaDriver.memFree(dev);
        CudaDriver.memFree(small);
        CudaDriver.memFreeHost(smallHost);
    }

    static String stats(long[] ns) {
        long[] s = ns.clone();
        Arrays.sort(s);
        return String.format("{\"p50\": %.1f, \"min\": %.1f, \"max\": %.1f}", s[s.length / 2] / 1e3, s[0] / 1e3,
                s[s.length - 1] / 1e3);
    }
}
