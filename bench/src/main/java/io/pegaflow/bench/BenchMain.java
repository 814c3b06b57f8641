package io.pegaflow.bench;

import io.pegaflow.engine.PegaflowException;
import picocli.CommandLine;
import picocli.CommandLine.Command;

/**
 * The Java half of {@code pegaflow-bench}: every subcommand runs one measurement and writes
 * its JSON report with {@code --json PATH}. The console script (python/pegaflow/cli.py) runs
 * {@code workload} (the main job) and {@code bridge} in Python and hands the rest to this.
 */
@Command(
        name = "pegaflow-bench",
        mixinStandardHelpOptions = true,
        version = "pegaflow-bench 0.1.0",
        description = "PegaFlow-JVM benchmarks; each subcommand prints a summary and writes JSON.",
        subcommands = {TransferCommand.class, PathsCommand.class, PathsWorkerCommand.class, AttachCommand.class, SsdCommand.class, RpcCommand.class, JmhCommand.class, RegistryCommand.class, RawTcpCommand.class})
public final class BenchMain {
    public static void main(String[] args) {
        System.exit(run(new BenchMain(), args));
    }

    /** Runs a picocli command whose user errors print as one line (exit 2), not a stack trace. */
    static int run(Object command, String[] args) {
        io.pegaflow.engine.logging.Logs.configure("info", "text"); // one line per record, as the server's
        CommandLine cli = new CommandLine(command);
        // A user error is one line naming the value, not a stack trace.
        cli.setExecutionExceptionHandler((e, cmd, parsed) -> {
            if (e instanceof PegaflowException || e instanceof IllegalArgumentException) {
                cmd.getErr().println(cmd.getCommandName() + ": " + e.getMessage());
                return 2;
            }
            throw e;
        });
        return cli.execute(args);
    }
}
