package io.pegaflow.engine.ssd;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Sizes;
import java.nio.file.Path;
import java.util.List;

/**
 * Settings of the SSD tier, validated here. {@code capacityBytes} is split evenly over
 * {@code paths.size() * shardsPerPath} shard files ({@code pegaflow-ssd-<i>.shard} in each
 * path); each shard is a ring of records that grows to its share and then wraps.
 *
 * @param writeQueueBlocks sealed blocks waiting for the disk; a full queue leaves new blocks
 *     in DRAM only (counted), it never blocks a save
 * @param writeThreads     concurrent record writes
 * @param readThreads      concurrent record reads (prefetch)
 * @param maxPrefetchBlocks blocks being read back at once, over every request; their pool
 *     space is reserved when the read starts
 */
public record SsdConfig(List<Path> paths, long capacityBytes, int shardsPerPath, int writeQueueBlocks,
        int writeThreads, int readThreads, int maxPrefetchBlocks) {
    /** As the original's {@code --ssd-cache-capacity}. */
    public static final String DEFAULT_CAPACITY = "512gb";
    public static final int DEFAULT_WRITE_QUEUE_BLOCKS = 512;
    public static final int DEFAULT_WRITE_THREADS = 2;
    public static final int DEFAULT_READ_THREADS = 4;
    /** As the original's server CLI. */
    public static final int DEFAULT_MAX_PREFETCH_BLOCKS = 800;

    public SsdConfig {
        if (paths == null || paths.isEmpty()) {
            throw new InvalidArgumentException("SSD tier: no cache path; expected at least one --ssd-cache-path");
        }
        paths = List.copyOf(paths);
        check("shards per path", shardsPerPath, 1, 256);
        check("write queue depth (blocks)", writeQueueBlocks, 1, 1 << 20);
        check("write threads", writeThreads, 1, 64);
        check("read threads", readThreads, 1, 256);
        check("max prefetch blocks", maxPrefetchBlocks, 1, 1 << 20);
        long shards = (long) paths.size() * shardsPerPath;
        long min = shards * SsdShard.MIN_BYTES;
        if (capacityBytes < min) {
            throw new InvalidArgumentException("SSD capacity " + Sizes.format(capacityBytes) + " for " + shards
                    + " shard(s); expected at least " + Sizes.format(min) + " (" + Sizes.format(SsdShard.MIN_BYTES)
                    + " a shard)");
        }
    }

    /**
     * From lines {@code ssd_cache_path=DIR} (repeatable) and {@code ssd_cache_capacity=SIZE}
     * (default {@link #DEFAULT_CAPACITY}), as the connector passes embedded mode's settings; null when no path is given.
     */
    public static SsdConfig parse(String text) {
        List<Path> paths = new java.util.ArrayList<>();
        long capacity = Sizes.parse(DEFAULT_CAPACITY);
        for (String line : text.split("\n")) {
            if (line.isBlank()) {
                continue;
            }
            int eq = line.indexOf('=');
            String key = eq < 0 ? line : line.substring(0, eq).strip();
            String value = eq < 0 ? "" : line.substring(eq + 1).strip();
            switch (key) {
                case "ssd_cache_path" -> paths.add(Path.of(value));
                case "ssd_cache_capacity" -> capacity = Sizes.parse(value);
                default -> throw new InvalidArgumentException("SSD setting '" + key
                        + "'; expected ssd_cache_path=DIR or ssd_cache_capacity=SIZE");
            }
        }
        return paths.isEmpty() ? null : of(paths, capacity);
    }

    /** Defaults for everything but where and how much. */
    public static SsdConfig of(List<Path> paths, long capacityBytes) {
        return new SsdConfig(paths, capacityBytes, 1, DEFAULT_WRITE_QUEUE_BLOCKS, DEFAULT_WRITE_THREADS,
                DEFAULT_READ_THREADS, DEFAULT_MAX_PREFETCH_BLOCKS);
    }

    public SsdConfig withQueue(int writeQueueBlocks) {
        return new SsdConfig(paths, capacityBytes, shardsPerPath, writeQueueBlocks, writeThreads, readThreads,
                maxPrefetchBlocks);
    }

    public SsdConfig withThreads(int writeThreads, int readThreads) {
        return new SsdConfig(paths, capacityBytes, shardsPerPath, writeQueueBlocks, writeThreads, readThreads,
                maxPrefetchBlocks);
    }

    private static void check(String what, int value, int min, int max) {
        if (value < min || value > max) {
            throw new InvalidArgumentException("SSD " + what + " " + value + "; expected " + min + ".." + max);
        }
    }
}
