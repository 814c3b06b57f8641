package io.pegaflow.bench;

import picocli.CommandLine.Command;

/** The GPU machine's slim entry point (ci/gpu-bundle.sh): only {@code transfer}, no server or JMH classes. */
@Command(name = "pegaflow-bench", mixinStandardHelpOptions = true, subcommands = {TransferCommand.class})
public final class GpuBenchMain {
    public static void main(String[] args) {
        System.exit(BenchMain.run(new GpuBenchMain(), args));
    }
}
