package io.pegaflow.engine.metrics;

/**
 * The engine's distributions, observed in nanoseconds and reported in seconds, each with the
 * bucket bounds an operator reads it by (pegaflow-server's {@code /metrics}).
 */
public enum Histogram {
    SAVE_COPY("pegaflow_save_copy_seconds", "duration of one save's copy, as its copier measured it",
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
    LOAD_COPY("pegaflow_load_copy_seconds", "duration of one load's copy, as its copier measured it",
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
    BLOCK_RESIDENCE("pegaflow_block_residence_seconds", "how long a block stayed in the pool, from sealed to evicted or cleared",
            1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600);

    private final String metricName;
    private final String help;
    private final double[] bounds;

    Histogram(String metricName, String help, double... bounds) {
        this.metricName = metricName;
        this.help = help;
        this.bounds = bounds;
    }

    public String metricName() {
        return metricName;
    }

    public String help() {
        return help;
    }

    /** Bucket upper bounds in seconds, ascending. */
    public double[] bounds() {
        return bounds.clone();
    }
}
