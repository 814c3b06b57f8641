package io.pegaflow.engine;

import io.pegaflow.engine.metrics.MetricsSink;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.store.CachePolicy;
import io.pegaflow.engine.store.KvEventLog;
import io.pegaflow.engine.store.Quotas;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import java.time.Duration;
import java.util.function.Function;
import java.util.function.LongSupplier;

/**
 * Every engine setting, validated once in {@link Builder#build()}; nothing below reads
 * system properties or the environment. Defaults follow the original PegaFlow (lease TTL
 * 600 s, sweep every 30 s, partially saved blocks dropped after 5 min).
 *
 * @param poolBytes     size of the host pool
 * @param leaseTtl      how long an unconsumed lease pins its blocks
 * @param sweepInterval how often the background sweeper expires leases; zero disables the
 *                      thread (leases still expire on every query, load and release)
 * @param inflightTtl   how long a block with some but not all slots saved may wait
 * @param copyTtl       how long a save or load may stay open before it is rolled back (its
 *                      copier died without a session to say so)
 * @param copyThreads   threads of the host copy engine (also used to pre-fault the pool)
 * @param prefault      commit every pool page at start instead of on first write
 * @param transfer      builds the copy engine over the pool (host by default; CUDA later)
 * @param metrics       extra sink that receives every counter and gauge (null: none)
 * @param nanoClock     monotonic clock in nanoseconds (tests substitute a fake)
 * @param ssd           the SSD tier below the pool (null: none)
 * @param quotas        what each instance, and all together, may hold at once ({@link Quotas#DEFAULTS})
 * @param hitCeilingWindows windows of the hit-rate ceiling's distinct-block sketch, e.g. {@code 15m}, {@code 1h}
 *                      ({@link io.pegaflow.engine.metrics.DistinctBlocks}; empty: none)
 * @param kvEventCapacity block events the store keeps for readers ({@link KvEventLog}; 0: none)
 * @param admission     which blocks saves write: {@code all}, or {@code seen:N} (after N lookups; {@link CachePolicy})
 * @param eviction      which unreferenced block leaves first: {@code lru}, or {@code lfu} (frequency-aware)
 */
public record EngineConfig(
        long poolBytes,
        Duration leaseTtl,
        Duration sweepInterval,
        Duration inflightTtl,
        Duration copyTtl,
        int copyThreads,
        boolean prefault,
        Function<HostPool, TransferEngine> transfer,
        MetricsSink metrics,
        LongSupplier nanoClock,
        SsdConfig ssd,
        Quotas quotas,
        java.util.List<String> hitCeilingWindows,
        int kvEventCapacity,
        String admission,
        String eviction) {

    public static Builder builder() {
        return new Builder();
    }

    /**
     * Refuses a bad {@code admission} ({@code all}, {@code seen:N}) or {@code eviction}
     * ({@code lru}, {@code lfu}) naming the value, for callers that check flags before they
     * build a config (pegaflow-server's settings).
     */
    public static void checkPolicies(String admission, String eviction) {
        CachePolicy.check(admission, eviction);
    }

    /** Builder with the defaults above; {@link #build()} validates. */
    public static final class Builder {
        private long poolBytes = Sizes.parse("1gb");
        private Duration leaseTtl = Duration.ofSeconds(600);
        private Duration sweepInterval = Duration.ofSeconds(30);
        private Duration inflightTtl = Duration.ofMinutes(5);
        private Duration copyTtl = Duration.ofMinutes(3);
        private int copyThreads = 2;
        private boolean prefault;
        private Function<HostPool, TransferEngine> transfer;
        private MetricsSink metrics;
        private LongSupplier nanoClock = System::nanoTime;
        private SsdConfig ssd;
        private Quotas quotas = Quotas.DEFAULTS;
        private java.util.List<String> hitCeilingWindows = java.util.List.of("15m", "1h", "1d");
        private int kvEventCapacity = 65_536;
        private String admission = "all";
        private String eviction = "lru";

        private Builder() {}

        /** Pool size as text, e.g. {@code "30gb"} (binary units). */
        public Builder poolSize(String size) {
            this.poolBytes = Sizes.parse(size);
            return this;
        }

        public Builder poolBytes(long bytes) {
            this.poolBytes = bytes;
            return this;
        }

        public Builder leaseTtl(Duration ttl) {
            this.leaseTtl = ttl;
            return this;
        }

        public Builder sweepInterval(Duration interval) {
            this.sweepInterval = interval;
            return this;
        }

        public Builder inflightTtl(Duration ttl) {
            this.inflightTtl = ttl;
            return this;
        }

        public Builder copyTtl(Duration ttl) {
            this.copyTtl = ttl;
            return this;
        }

        public Builder copyThreads(int threads) {
            this.copyThreads = threads;
            return this;
        }

        public Builder prefault(boolean prefault) {
            this.prefault = prefault;
            return this;
        }

        public Builder transfer(Function<HostPool, TransferEngine> factory) {
            this.transfer = factory;
            return this;
        }

        public Builder metrics(MetricsSink sink) {
            this.metrics = sink;
            return this;
        }

        public Builder nanoClock(LongSupplier clock) {
            this.nanoClock = clock;
            return this;
        }

        public Builder ssd(SsdConfig ssd) {
            this.ssd = ssd;
            return this;
        }

        public Builder quotas(Quotas quotas) {
            this.quotas = quotas;
            return this;
        }

        public Builder kvEventCapacity(int events) {
            this.kvEventCapacity = events;
            return this;
        }

        /** {@code all} (default) or {@code seen:N}: a block is saved once lookups asked for it N times. */
        public Builder admission(String policy) {
            this.admission = policy;
            return this;
        }

        /** {@code lru} (default) or {@code lfu}: of the least recently used blocks, the least asked for leaves first. */
        public Builder eviction(String policy) {
            this.eviction = policy;
            return this;
        }

        public Builder hitCeilingWindows(java.util.List<String> windows) {
            this.hitCeilingWindows = windows == null ? java.util.List.of() : java.util.List.copyOf(windows);
            return this;
        }

        public EngineConfig build() {
            if (poolBytes < HostPool.ALIGNMENT) {
                throw new InvalidArgumentException("pool size " + poolBytes + " bytes; expected at least "
                        + HostPool.ALIGNMENT + " bytes (e.g. 64mb)");
            }
            requirePositive("leaseTtl", leaseTtl);
            requirePositive("inflightTtl", inflightTtl);
            requirePositive("copyTtl", copyTtl);
            if (sweepInterval == null || sweepInterval.isNegative()) {
                throw new InvalidArgumentException("sweepInterval " + sweepInterval + "; expected >= 0 (0 disables the sweeper thread)");
            }
            if (copyThreads < 1 || copyThreads > 256) {
                throw new InvalidArgumentException("copyThreads " + copyThreads + "; expected 1..256");
            }
            if (nanoClock == null) {
                throw new InvalidArgumentException("nanoClock is null; expected a monotonic clock");
            }
            int threads = copyThreads;
            Function<HostPool, TransferEngine> factory =
                    transfer != null ? transfer : pool -> new HostTransferEngine(pool, threads);
            if (quotas == null) {
                throw new InvalidArgumentException("quotas is null; expected Quotas.DEFAULTS or others");
            }
            io.pegaflow.engine.metrics.DistinctBlocks.check(hitCeilingWindows); // refuses a bad window here, naming it
            if (kvEventCapacity < 0 || kvEventCapacity > 1 << 24) {
                throw new InvalidArgumentException("kvEventCapacity " + kvEventCapacity + "; expected 0..16777216");
            }
            checkPolicies(admission, eviction);
            return new EngineConfig(poolBytes, leaseTtl, sweepInterval, inflightTtl, copyTtl, copyThreads, prefault, factory,
                    metrics, nanoClock, ssd, quotas, hitCeilingWindows, kvEventCapacity, admission, eviction);
        }

        private static void requirePositive(String name, Duration d) {
            if (d == null || d.isNegative() || d.isZero()) {
                throw new InvalidArgumentException(name + " " + d + "; expected a positive duration");
            }
        }
    }
}
