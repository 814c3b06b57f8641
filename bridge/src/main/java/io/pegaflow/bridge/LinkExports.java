package io.pegaflow.bridge;

import static io.pegaflow.bridge.Marshal.buffer;
import static io.pegaflow.bridge.Marshal.guard;
import static io.pegaflow.bridge.Marshal.putText;
import static io.pegaflow.bridge.Marshal.str;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.client.StoreLink;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.WorkerSpec;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * The store link's exports: one handle per vLLM process and settings owns the mode, the
 * engine or server client, the registrations and the reconnects ({@link StoreLink}); the
 * connector brains are created on it and the host only forwards.
 */
final class LinkExports {
    static final Marshal.Handles<StoreLink> LINKS = new Marshal.Handles<>("store link");

    private LinkExports() {}

    /**
     * {@code mode}: auto | embedded | server; {@code health_interval_ms}: how often a daemon
     * thread checks the server (0: never). In server mode an absent server is not an error.
     * {@code ssd}: embedded mode's SSD tier ({@link io.pegaflow.engine.ssd.SsdConfig#parse}; empty: none).
     */
    static int pfLinkOpen(MemorySegment mode, MemorySegment endpoint, MemorySegment poolSize, int copyThreads,
            long deadlineMs, long healthIntervalMs, MemorySegment ssd, MemorySegment outLink) {
        return guard(() -> {
            MemorySegment out = buffer(outLink, 8, "out_link");
            if (healthIntervalMs < 0) {
                throw new InvalidArgumentException("health_interval_ms " + healthIntervalMs + "; expected >= 0");
            }
            StoreLink.Settings settings = new StoreLink.Settings(str(mode, "mode"), str(endpoint, "endpoint"),
                    str(poolSize, "pool_size"), copyThreads, deadlineMs, Duration.ofMillis(healthIntervalMs),
                    io.pegaflow.engine.ssd.SsdConfig.parse(str(ssd, "ssd")), Marshal.joinSecret());
            out.set(JAVA_LONG, 0, LINKS.add(StoreLink.open(settings)));
        });
    }

    /**
     * Registers a worker through the link (now, and again on every new server): its instance
     * and its layers as in {@code register_worker}; {@code transfer} 0 host copies, 1 CUDA on
     * {@code device}.
     */
    static int pfLinkRegisterWorker(long link, MemorySegment instanceId, MemorySegment namespace, int tpSize,
            int worldSize, int workerRank, int tpRank, int transfer, int device, int numLayers, MemorySegment layerNames,
            MemorySegment layerParams) {
        return guard(() -> {
            if (transfer != 0 && transfer != 1) {
                throw new InvalidArgumentException("transfer " + transfer + "; expected 0 (host) or 1 (cuda)");
            }
            String id = str(instanceId, "instance_id");
            InstanceSpec instance = new InstanceSpec(id, str(namespace, "namespace"), tpSize, worldSize);
            WorkerSpec worker = new WorkerSpec(workerRank, tpRank, device,
                    EngineExports.regions(numLayers, layerNames, layerParams));
            LINKS.get(link).registerWorker(instance, worker, new StoreLink.Copier(transfer == 1, device));
        });
    }

    static int pfLinkUnregisterInstance(long link, MemorySegment instanceId) {
        return guard(() -> LINKS.get(link).unregisterInstance(str(instanceId, "instance_id")));
    }

    /**
     * Lines {@code key=value}: mode, generation, detached, engine (0/1), server_id,
     * registrations. NUL-terminated into buf; *out_len is the text's length.
     */
    static int pfLinkStatus(long link, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> {
            StoreLink.Status s = LINKS.get(link).status();
            String text = "mode=" + s.mode().text() + "\ngeneration=" + s.generation() + "\ndetached=" + (s.detached() ? 1 : 0)
                    + "\nengine=" + (s.engine() ? 1 : 0) + "\nserver_id=" + s.serverId() + "\nregistrations="
                    + s.registrations() + "\n";
            putText(text.getBytes(StandardCharsets.UTF_8), buf, cap, outLen, "link status");
        });
    }

    /** The bound engine's stats as JSON, like {@code stats} (PF_UNAVAILABLE while none is bound). */
    static int pfLinkStats(long link, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> putText(EngineExports.statsJson(LINKS.get(link).stats()), buf, cap, outLen, "stats"));
    }

    /**
     * vLLM's reset_cache for {@code instance_id} on the bound store: its namespace's
     * unreferenced blocks leave the pool and the SSD tier. {@code out[0]}: blocks dropped from
     * the pool, {@code out[1]}: SSD records forgotten. PF_UNAVAILABLE while no store is bound.
     */
    static int pfLinkResetCache(long link, MemorySegment instanceId, MemorySegment outCounts) {
        return guard(() -> {
            MemorySegment out = buffer(outCounts, 16, "out_counts");
            io.pegaflow.engine.store.LocalStore.Cleared c = LINKS.get(link).resetCache(str(instanceId, "instance_id"));
            out.set(JAVA_LONG, 0, c.blocks());
            out.set(JAVA_LONG, 8, c.ssdRecords());
        });
    }

    /**
     * The bound store's block events of {@code instance_id}'s namespace after {@code after}, at
     * most {@code max} (1..10,000): text, a first line {@code next=N gap=0|1}, then one line per
     * event: {@code S} (stored) or {@code R} (removed), the tier, the block's key in hex.
     * NUL-terminated into buf; PF_UNAVAILABLE while no store is bound.
     */
    static int pfLinkKvEvents(long link, MemorySegment instanceId, long after, int max, MemorySegment buf, int cap,
            MemorySegment outLen) {
        return guard(() -> {
            io.pegaflow.engine.store.KvEventLog.Batch b = LINKS.get(link).kvEvents(str(instanceId, "instance_id"), after, max);
            StringBuilder text = new StringBuilder(32 + b.events().size() * 80);
            text.append("next=").append(b.next()).append(" gap=").append(b.gap() ? 1 : 0).append('\n');
            java.util.HexFormat hex = java.util.HexFormat.of();
            for (io.pegaflow.engine.store.KvEventLog.Event e : b.events()) {
                text.append(e.kind() == io.pegaflow.engine.store.KvEventLog.Kind.STORED ? 'S' : 'R').append(' ').append(e.tier())
                        .append(' ').append(hex.formatHex(e.hash())).append('\n');
            }
            putText(text.toString().getBytes(StandardCharsets.UTF_8), buf, cap, outLen, "KV events");
        });
    }

    /**
     * A request's retention hint "low": {@code n} hashes of {@code hash_len} bytes packed at
     * {@code hashes} (n checked against its cap before they are read) go first when the pool
     * needs room. {@code *out_blocks}: how many the store held. PF_UNAVAILABLE while no store is bound.
     */
    static int pfLinkDemote(long link, MemorySegment instanceId, MemorySegment hashes, int n, int hashLen,
            MemorySegment outBlocks) {
        return guard(() -> {
            MemorySegment out = buffer(outBlocks, 4, "out_blocks");
            io.pegaflow.engine.BlockHashes h = Marshal.hashes(hashes, n, hashLen);
            out.set(JAVA_INT, 0, LINKS.get(link).demote(str(instanceId, "instance_id"), h));
        });
    }

    /** Closes the link: its engine or client (copies in flight finish first). */
    static int pfLinkClose(long link) {
        return guard(() -> LINKS.take(link).close());
    }

    static void closeAll() {
        for (Long h : LINKS.handles()) {
            StoreLink l = LINKS.remove(h);
            if (l != null) {
                l.close();
            }
        }
    }
}
