package io.pegaflow.bench;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import java.nio.file.Path;
import java.util.Locale;
import java.util.concurrent.Callable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * What a worker's attach to a server's shared pool costs, in its own process as a worker
 * does it: map the pool file, pin it for CUDA (the copy engine's creation, which also loads
 * the kernel and warms the lanes). Prints one line {@code attach map_s pin_s ready_s pinned_s}: ready is when
 * the engine can copy (with background pinning: the first chunk pinned), pinned when every
 * chunk is.
 * {@code pegaflow-bench paths --attach-pool-size} runs it under several settings.
 */
@Command(name = "attach", hidden = true, mixinStandardHelpOptions = true,
        description = "Map and pin a shared pool as a worker does; prints the seconds.")
final class AttachCommand implements Callable<Integer> {
    @Option(names = "--pool-path", required = true)
    Path poolPath;

    @Option(names = "--pool-bytes", required = true)
    long poolBytes;

    @Option(names = "--device", defaultValue = "0")
    int device;

    @Option(names = "--pin-in-background", defaultValue = "true", negatable = true)
    boolean background;

    @Override
    public Integer call() {
        long t0 = System.nanoTime();
        try (HostPool pool = HostPool.shared(poolPath, poolBytes, false)) {
            long t1 = System.nanoTime();
            try (CudaTransferEngine e = CudaTransferEngine.create(pool,
                    CudaOptions.defaults().withDevice(device).withPinInBackground(background))) {
                long t2 = System.nanoTime();
                long full = e.awaitFullyPinned();
                System.out.println(String.format(Locale.ROOT, "attach %.3f %.3f %.3f %.3f", (t1 - t0) / 1e9,
                        e.registrationNanos() / 1e9, (t2 - t0) / 1e9, (t1 - t0) / 1e9 + full / 1e9));
            }
        }
        return 0;
    }
}
