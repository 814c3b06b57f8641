package io.pegaflow.bench;

import picocli.CommandLine;
import picocli.CommandLine.Command;

/**
 * {@code pegaflow-bench}: every subcommand runs one measurement and writes its JSON report
 * with {@code --json PATH}. {@code workload} is the project's main job ({@code make run}).
 */
@Command(
        name = "pegaflow-bench",
        mixinStandardHelpOptions = true,
        version = "pegaflow-bench 0.1.0",
        description = "PegaFlow-JVM benchmarks; each subcommand prints a summary and writes JSON.",
        subcommands = {WorkloadCommand.class, JmhCommand.class})
public final class BenchMain {
    public static void main(String[] args) {
        System.exit(new CommandLine(new BenchMain()).execute(args));
    }
}
