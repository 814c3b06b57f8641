package io.pegaflow.bridge;

import static io.pegaflow.bridge.Marshal.buffer;
import static io.pegaflow.bridge.Marshal.bytes;
import static io.pegaflow.bridge.Marshal.guard;
import static io.pegaflow.bridge.Marshal.hashes;
import static io.pegaflow.bridge.Marshal.putText;
import static io.pegaflow.bridge.Marshal.str;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.client.EngineClient;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.PrefixRequests;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.TransferFailedException;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.hash.VllmBlockHasher;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The engine's exports: create or connect an engine, register, save, query, load, release,
 * and the completions of asynchronous copies (see {@code pegaflow.h} for each contract).
 */
final class EngineExports {
    static final Marshal.Handles<PegaEngine> ENGINES = new Marshal.Handles<>("engine");
    static final Marshal.Handles<CompletableFuture<?>> COMPLETIONS = new Marshal.Handles<>("completion");

    /** Request-owned prefix queries of each engine handle ({@code query_request}), made on first use. */
    static final Map<Long, PrefixRequests> PREFIX_REQUESTS = new ConcurrentHashMap<>();
    /** {@code void (*)(int64_t completion, int32_t status, void *user)}, called through its address. */
    private static final MethodHandle CALLBACK = Linker.nativeLinker()
            .downcallHandle(FunctionDescriptor.ofVoid(JAVA_LONG, JAVA_INT, ADDRESS));
    /** Fields per arena in {@code register_rank}'s {@code arena_params}. */
    static final int ARENA_PARAMS = 6;
    /** {@code query_request} flag: every block or none (a decode node that cannot recompute). */
    static final int QUERY_ALL_OR_NOTHING = 1;

    /** Fields per layer in {@code register_worker}'s {@code layer_params}. */
    static final int LAYER_PARAMS = 7;

    private EngineExports() {}

    static PegaEngine engine(long handle) {
        return ENGINES.get(handle);
    }

    static CompletableFuture<?> completion(long handle) {
        return COMPLETIONS.get(handle);
    }

    /** Copies this thread's last error message (UTF-8, NUL-terminated, truncated to cap-1); returns its full length. */
    static int pfLastError(MemorySegment buf, int cap) {
        try {
            byte[] msg = Marshal.lastError().getBytes(StandardCharsets.UTF_8);
            if (!buf.equals(MemorySegment.NULL) && cap > 0) {
                MemorySegment b = buf.reinterpret(cap);
                int n = Math.min(msg.length, cap - 1);
                MemorySegment.copy(msg, 0, b, JAVA_BYTE, 0, n);
                b.set(JAVA_BYTE, n, (byte) 0);
            }
            return msg.length;
        } catch (Throwable t) {
            return 0;
        }
    }

    /** Does nothing: the cost of one call across the boundary. */
    static int pfNoop() {
        return 0;
    }

    /** {@code flags} bit 0: commit every pool page now ({@link EngineConfig#prefault()}). */
    static int pfEngineCreate(MemorySegment poolSize, int copyThreads, long leaseTtlMs, int transfer, int device,
            int flags, MemorySegment ssd, MemorySegment outEngine) {
        return guard(() -> {
            if ((flags & ~1) != 0) {
                throw new InvalidArgumentException("engine_create: flags 0x" + Integer.toHexString(flags)
                        + "; expected only bit 0 (prefault)");
            }
            EngineConfig.Builder b = settings(EngineConfig.builder().poolSize(str(poolSize, "pool_size")).copyThreads(copyThreads)
                    .prefault((flags & 1) != 0), str(ssd, "settings"));
            if (leaseTtlMs > 0) {
                b.leaseTtl(Duration.ofMillis(leaseTtlMs));
            }
            switch (transfer) {
                case 0 -> { }
                case 1 -> b.transfer(pool -> CudaTransferEngine.create(pool, CudaOptions.defaults().withDevice(device)));
                default -> throw new InvalidArgumentException("transfer " + transfer + "; expected 0 (host) or 1 (cuda)");
            }
            MemorySegment out = buffer(outEngine, 8, "out_engine");
            out.set(JAVA_LONG, 0, ENGINES.add(PegaEngine.create(b.build())));
        });
    }

    /**
     * engine_create's settings lines ({@code key=value}): {@code admission} and {@code eviction}
     * ({@link EngineConfig.Builder#admission}, {@link EngineConfig.Builder#eviction}), the rest
     * the SSD tier's ({@code ssd_cache_path}, {@code ssd_cache_capacity}).
     */
    static EngineConfig.Builder settings(EngineConfig.Builder b, String text) {
        StringBuilder ssd = new StringBuilder();
        for (String line : text.split("\n")) {
            String key = line.contains("=") ? line.substring(0, line.indexOf('=')).strip() : line.strip();
            String value = line.contains("=") ? line.substring(line.indexOf('=') + 1).strip() : "";
            switch (key) {
                case "admission" -> b.admission(value);
                case "eviction" -> b.eviction(value);
                default -> ssd.append(line).append('\n');
            }
        }
        return b.ssd(io.pegaflow.engine.ssd.SsdConfig.parse(ssd.toString()));
    }

    static int pfEngineClose(long engine) {
        return guard(() -> {
            PegaEngine e = ENGINES.take(engine);
            SERVER_IDS.remove(engine);
            PREFIX_REQUESTS.remove(engine);
            e.close();
        });
    }

    static int pfRegisterInstance(long engine, MemorySegment instanceId, MemorySegment namespace, int tpSize, int worldSize) {
        return guard(() -> engine(engine).registerInstance(
                new InstanceSpec(str(instanceId, "instance_id"), str(namespace, "namespace"), tpSize, worldSize)));
    }

    /**
     * {@code layer_names}: the layers' names separated by '\n'; {@code layer_params}: per
     * layer 7 int64 (layout 0=SPLIT_KV 1=COMBINED 2=MLA, base address, region bytes, blocks,
     * block stride, segment bytes, segment offset).
     */
    static int pfRegisterWorker(long engine, MemorySegment instanceId, int workerRank, int tpRank, int deviceId,
            int numLayers, MemorySegment layerNames, MemorySegment layerParams) {
        return guard(() -> {
            List<LayerRegion> regions = regions(numLayers, layerNames, layerParams);
            engine(engine).registerWorker(str(instanceId, "instance_id"), new WorkerSpec(workerRank, tpRank, deviceId, regions));
        });
    }

    static int pfUnregisterInstance(long engine, MemorySegment instanceId) {
        return guard(() -> engine(engine).unregisterInstance(str(instanceId, "instance_id")));
    }

    /** {@code layer_names}: NULL for all of the worker's layers, else '\n'-separated names. */
    static int pfSave(long engine, MemorySegment instanceId, int workerRank, int n, MemorySegment blockIds,
            MemorySegment hashes, int hashLen, MemorySegment layerNames, long waitStream, MemorySegment outCompletion) {
        return guard(() -> {
            // Every count against its cap before the caller's memory is read.
            Marshal.checkCount(n, Limits.MAX_HASHES_PER_CALL, "Limits.MAX_HASHES_PER_CALL", "save: block_ids");
            Marshal.checkHashes(n, hashLen);
            MemorySegment out = buffer(outCompletion, 8, "out_completion");
            List<String> layers = layerNames.equals(MemorySegment.NULL) ? null : List.of(str(layerNames, "layer_names").split("\n"));
            Limits.checkCount("layer names of one save", layers == null ? 0 : layers.size(), Limits.MAX_LAYERS_PER_WORKER,
                    "MAX_LAYERS_PER_WORKER");
            CompletableFuture<CopyResult> f = engine(engine).save(str(instanceId, "instance_id"), workerRank, layers,
                    Marshal.blockIds(blockIds, n, "save: block_ids"), hashes(hashes, n, hashLen), waitStream);
            out.set(JAVA_LONG, 0, COMPLETIONS.add(f));
        });
    }

    /**
     * Writes the hit count and the pending count (two int32) and, when the hit is > 0, the
     * 16-byte lease (else 16 zero bytes).
     */
    static int pfQuery(long engine, MemorySegment instanceId, int n, MemorySegment hashes, int hashLen,
            MemorySegment outHit, MemorySegment outLease) {
        return guard(() -> {
            MemorySegment hit = buffer(outHit, 8, "out_hit");
            MemorySegment lease = buffer(outLease, Token.BYTES, "out_lease");
            if (n < 0) {
                throw new InvalidArgumentException("query: hash count " + n + "; expected >= 0");
            }
            Marshal.checkHashes(n, hashLen);
            QueryResult q = engine(engine).query(str(instanceId, "instance_id"), hashes(hashes, n, hashLen));
            hit.set(JAVA_INT, 0, q.hitBlocks());
            hit.set(JAVA_INT, 4, q.pendingBlocks());
            byte[] bytes = q.hasLease() ? q.lease().toBytes() : new byte[Token.BYTES];
            MemorySegment.copy(bytes, 0, lease, JAVA_BYTE, 0, Token.BYTES);
        });
    }

    static int pfLoad(long engine, MemorySegment instanceId, int workerRank, MemorySegment lease, int n,
            MemorySegment dstBlockIds, MemorySegment outCompletion) {
        return guard(() -> {
            Marshal.checkCount(n, Limits.MAX_HASHES_PER_CALL, "Limits.MAX_HASHES_PER_CALL", "load: dst_block_ids");
            MemorySegment out = buffer(outCompletion, 8, "out_completion");
            Token id = Token.fromBytes(buffer(lease, Token.BYTES, "lease").toArray(JAVA_BYTE));
            CompletableFuture<CopyResult> f = engine(engine).load(str(instanceId, "instance_id"), workerRank, id,
                    Marshal.blockIds(dstBlockIds, n, "load: dst_block_ids"));
            out.set(JAVA_LONG, 0, COMPLETIONS.add(f));
        });
    }

    static int pfRelease(long engine, MemorySegment instanceId, MemorySegment lease) {
        return guard(() -> engine(engine).release(str(instanceId, "instance_id"),
                Token.fromBytes(buffer(lease, Token.BYTES, "lease").toArray(JAVA_BYTE))));
    }

    /**
     * Waits up to {@code timeout_ms} (< 0: forever) for a completion; on success writes three
     * int64: blocks saved (or loaded), blocks skipped (saves), bytes copied. A failed operation
     * returns its error code (TRANSFER_FAILED: {@code failed_blocks} lists the block ids).
     */
    static int pfWait(long completion, long timeoutMs, MemorySegment outValues) {
        return guard(() -> {
            CompletableFuture<?> f = completion(completion);
            Object r;
            try {
                r = timeoutMs < 0 ? f.get() : f.get(timeoutMs, TimeUnit.MILLISECONDS);
            } catch (TimeoutException e) {
                throw new PegaflowException(ErrorCode.TIMEOUT, "completion " + completion + " not done after " + timeoutMs + " ms");
            } catch (ExecutionException e) {
                throw failure(e.getCause());
            }
            if (!outValues.equals(MemorySegment.NULL)) {
                MemorySegment out = outValues.reinterpret(24);
                long[] v = r instanceof CopyResult c ? new long[] {c.blocks(), c.skippedBlocks(), c.bytes()} : new long[3];
                MemorySegment.copy(v, 0, out, JAVA_LONG, 0, 3);
            }
        });
    }

    static int pfPoll(long completion, MemorySegment outDone) {
        return guard(() -> buffer(outDone, 4, "out_done").set(JAVA_INT, 0, completion(completion).isDone() ? 1 : 0));
    }

    static int pfCompletionFree(long completion) {
        return guard(() -> {
            COMPLETIONS.take(completion);
        });
    }

    /** The block ids a failed transfer did not move (up to cap), and their count. */
    static int pfFailedBlocks(long completion, MemorySegment out, int cap, MemorySegment outCount) {
        return guard(() -> {
            CompletableFuture<?> f = completion(completion);
            long[] ids = new long[0];
            if (f.isCompletedExceptionally()) {
                Throwable t = f.handle((r, e) -> e).join();
                if (t instanceof TransferFailedException tf) {
                    ids = tf.blockIds();
                }
            }
            buffer(outCount, 4, "out_count").set(JAVA_INT, 0, ids.length);
            int n = Math.min(ids.length, Math.max(0, cap));
            if (n > 0) {
                MemorySegment.copy(ids, 0, buffer(out, 8L * n, "out"), JAVA_LONG, 0, n);
            }
        });
    }

    /** A failed operation's cause as the error the C caller sees. */
    private static PegaflowException failure(Throwable cause) {
        Throwable c = cause instanceof java.util.concurrent.CompletionException && cause.getCause() != null
                ? cause.getCause() : cause;
        return c instanceof PegaflowException pe ? pe : new PegaflowException(ErrorCode.INTERNAL, String.valueOf(c), c);
    }

    /**
     * Calls {@code fn(completion, status, user)} once when the completion is done (at once, on
     * this thread, when it already is; else on the engine thread that finished it). The I/O
     * does not depend on the handle: freeing it first still runs the callback.
     */
    static int pfCompletionOnDone(long completion, MemorySegment fn, MemorySegment user) {
        return guard(() -> {
            if (fn.equals(MemorySegment.NULL)) {
                throw new InvalidArgumentException("callback is NULL; expected a function pointer "
                        + "void (*)(int64_t completion, int32_t status, void *user)");
            }
            CompletableFuture<?> f = completion(completion);
            f.whenComplete((r, e) -> {
                int status = e == null ? 0 : failure(e).code().value();
                try {
                    CALLBACK.invokeExact(fn, completion, status, user);
                } catch (Throwable t) {
                    System.getLogger(EngineExports.class.getName()).log(System.Logger.Level.ERROR,
                            "completion callback " + fn + " of completion " + completion + " failed", t);
                }
            });
        });
    }

    /** The visibility barrier of one engine (see {@link PegaEngine#flush}). */
    static int pfFlush(long engine, long timeoutMs) {
        return guard(() -> engine(engine).flush(timeoutMs));
    }

    /**
     * A prefix query owned by request {@code req_id} ({@link PrefixRequests}): out_state gets
     * {state (0 ready, 1 loading), hit blocks, missing blocks}; the lease (16 bytes) is set
     * when ready with a hit, else zero.
     */
    static int pfQueryRequest(long engine, MemorySegment instanceId, MemorySegment reqId, int n, MemorySegment hashes,
            int hashLen, int flags, MemorySegment outState, MemorySegment outLease) {
        return guard(() -> {
            MemorySegment state = buffer(outState, 12, "out_state");
            MemorySegment lease = buffer(outLease, Token.BYTES, "out_lease");
            if ((flags & ~QUERY_ALL_OR_NOTHING) != 0) {
                throw new InvalidArgumentException("query_request flags " + flags + "; expected 0 or "
                        + QUERY_ALL_OR_NOTHING + " (PF_QUERY_ALL_OR_NOTHING)");
            }
            PegaEngine e = engine(engine);
            PrefixRequests.Answer a = PREFIX_REQUESTS.computeIfAbsent(engine, k -> new PrefixRequests())
                    .query(e, str(instanceId, "instance_id"), str(reqId, "req_id"), hashes(hashes, n, hashLen),
                            (flags & QUERY_ALL_OR_NOTHING) != 0);
            state.set(JAVA_INT, 0, a.state() == PrefixRequests.State.READY ? 0 : 1);
            state.set(JAVA_INT, 4, a.hitBlocks());
            state.set(JAVA_INT, 8, a.missingBlocks());
            byte[] bytes = a.lease() != null ? a.lease().toBytes() : new byte[Token.BYTES];
            MemorySegment.copy(bytes, 0, lease, JAVA_BYTE, 0, Token.BYTES);
        });
    }

    /** Forgets a loading request; *out_was_loading (may be NULL) = 1 when it was. */
    static int pfQueryCancel(long engine, MemorySegment instanceId, MemorySegment reqId, MemorySegment outWasLoading) {
        return guard(() -> {
            engine(engine);
            PrefixRequests p = PREFIX_REQUESTS.get(engine);
            boolean was = p != null && p.cancel(str(instanceId, "instance_id"), str(reqId, "req_id"));
            if (!outWasLoading.equals(MemorySegment.NULL)) {
                outWasLoading.reinterpret(4).set(JAVA_INT, 0, was ? 1 : 0);
            }
        });
    }

    /**
     * One rank of an instance in one call: the instance (world = tp x pp; registering it
     * again with the same shape is a no-op) and the rank's arenas, each {@code ARENA_PARAMS}
     * int64: base, blocks, block stride, segment bytes, segments (1 or 2), segment stride.
     * The region registered is the reach of the last block.
     */
    static int pfRegisterRank(long engine, MemorySegment instanceId, MemorySegment namespace, int device, int tpRank,
            int tpSize, int ppRank, int ppSize, int nArenas, MemorySegment arenaNames, MemorySegment arenaParams) {
        return guard(() -> {
            if (tpSize < 1 || ppSize < 1 || tpRank < 0 || tpRank >= tpSize || ppRank < 0 || ppRank >= ppSize) {
                throw new InvalidArgumentException("register_rank: tp_rank " + tpRank + " of tp_size " + tpSize
                        + ", pp_rank " + ppRank + " of pp_size " + ppSize + "; expected 0 <= rank < size");
            }
            List<LayerRegion> arenas = arenas(nArenas, arenaNames, arenaParams);
            String id = str(instanceId, "instance_id");
            PegaEngine e = engine(engine);
            e.registerInstance(new InstanceSpec(id, str(namespace, "namespace"), tpSize, Math.multiplyExact(tpSize, ppSize)));
            e.registerWorker(id, new WorkerSpec(ppRank * tpSize + tpRank, tpRank, device, arenas));
        });
    }

    static List<LayerRegion> arenas(int n, MemorySegment names, MemorySegment params) {
        Table t = table("register_rank", "n_arenas", n, names, "arena_names", params, "arena_params", ARENA_PARAMS);
        String[] nameList = t.names();
        long[] p = t.params();
        List<LayerRegion> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            int at = i * ARENA_PARAMS;
            long base = p[at];
            long blocks = p[at + 1];
            long stride = p[at + 2];
            long segBytes = p[at + 3];
            long segments = p[at + 4];
            long segStride = p[at + 5];
            String where = "arena '" + nameList[i] + "'";
            if (segments != 1 && segments != 2) {
                throw new InvalidArgumentException(where + ": segments " + segments + "; expected 1 or 2");
            }
            if (blocks < 1 || blocks > Integer.MAX_VALUE) {
                throw new InvalidArgumentException(where + ": blocks " + blocks + "; expected 1.." + Integer.MAX_VALUE);
            }
            if (stride <= 0 || segBytes <= 0 || segStride < 0) {
                throw new InvalidArgumentException(where + ": block stride " + stride + ", segment bytes " + segBytes
                        + ", segment stride " + segStride + "; expected > 0, > 0, >= 0");
            }
            long reach;
            try {
                reach = Math.addExact(Math.addExact(Math.multiplyExact(blocks - 1, stride),
                        Math.multiplyExact(segments - 1, segStride)), segBytes);
            } catch (ArithmeticException ex) {
                throw new InvalidArgumentException(where + ": " + blocks + " blocks of stride " + stride
                        + " overflow 64 bits");
            }
            out.add(new LayerRegion(nameList[i], segments == 2 ? KvLayout.SPLIT_KV : KvLayout.COMBINED, base, reach,
                    (int) blocks, stride, segBytes, segments == 2 ? segStride : 0));
        }
        return out;
    }

    /**
     * vLLM's block hashes of the full blocks of {@code tokens} ({@link VllmBlockHasher}): {@code
     * *out_count} hashes of {@code *out_hash_len} bytes into {@code out} when they fit {@code cap}
     * (else PF_INVALID_ARGUMENT with the counts set; nothing is kept, calling again recomputes).
     */
    static int pfBlockHashes(MemorySegment algo, MemorySegment seed, MemorySegment parent, int parentLen,
            MemorySegment tokens, long nTokens, int blockSize, MemorySegment out, long cap, MemorySegment outCount,
            MemorySegment outHashLen) {
        return guard(() -> {
            if (nTokens < 0 || nTokens > VllmBlockHasher.MAX_TOKENS) {
                throw new InvalidArgumentException("block_hashes: " + nTokens + " tokens; expected 0 to "
                        + VllmBlockHasher.MAX_TOKENS);
            }
            if (parentLen < 0 || parentLen > 64) {
                throw new InvalidArgumentException("block_hashes: parent_len " + parentLen + "; expected 0 (the first block) to 64");
            }
            VllmBlockHasher h = new VllmBlockHasher(VllmBlockHasher.Algorithm.of(str(algo, "algo")),
                    seed.equals(MemorySegment.NULL) ? null : str(seed, "seed"));
            int[] t = nTokens == 0 ? new int[0] : buffer(tokens, 4 * nTokens, "tokens").toArray(JAVA_INT);
            BlockHashes hashes = h.chain(parentLen == 0 ? null : bytes(parent, parentLen, "parent"), t, blockSize);
            int hashLen = h.algorithm() == VllmBlockHasher.Algorithm.SHA256 || h.algorithm() == VllmBlockHasher.Algorithm.SHA256_CBOR
                    ? 32 : 16;
            buffer(outCount, 4, "out_count").set(JAVA_INT, 0, hashes.count());
            buffer(outHashLen, 4, "out_hash_len").set(JAVA_INT, 0, hashLen);
            byte[] packed = hashes.packed();
            if (cap < packed.length) {
                throw new InvalidArgumentException("block_hashes: " + hashes.count() + " hashes of " + hashLen
                        + " bytes do not fit " + cap + " bytes; pass a buffer of at least " + packed.length);
            }
            if (packed.length > 0) {
                MemorySegment.copy(packed, 0, buffer(out, packed.length, "out"), JAVA_BYTE, 0, packed.length);
            }
        });
    }

    /** Engine stats as JSON (UTF-8, NUL-terminated); *out_len is its length, PF_INVALID_ARGUMENT when it does not fit. */
    static int pfStats(long engine, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> {
            putText(statsJson(engine(engine).stats()), buf, cap, outLen, "stats");
        });
    }

    /** Gauges and counters as one JSON object. */
    static byte[] statsJson(EngineStats s) {
        {
            StringBuilder sb = new StringBuilder("{");
            for (Gauge g : Gauge.values()) {
                sb.append('"').append(g.metricName()).append("\":").append(s.get(g)).append(',');
            }
            for (Counter c : Counter.values()) {
                sb.append('"').append(c.metricName()).append("\":").append(s.get(c)).append(',');
            }
            sb.setCharAt(sb.length() - 1, '}');
            return sb.toString().getBytes(StandardCharsets.UTF_8);
        }
    }

    /** Closes every engine (waiting for copies in flight) and frees every completion: for process exit. */
    static int pfShutdown() {
        return guard(() -> {
            LinkExports.closeAll();
            for (Long h : ENGINES.handles()) {
                PegaEngine e = ENGINES.remove(h);
                if (e != null) {
                    e.close();
                }
            }
            COMPLETIONS.clear();
            PREFIX_REQUESTS.clear();
        });
    }

    /**
     * A worker engine whose control plane is pegaflow-server at {@code endpoint}
     * ({@code HOST:PORT}): it maps the server's shared pool and copies itself; every other
     * function works on the handle as on an embedded engine. {@code deadline_ms} bounds each
     * call to the server (an unreachable server is PF_UNAVAILABLE within it).
     */
    static int pfEngineConnect(MemorySegment endpoint, int copyThreads, int transfer, int device, long deadlineMs,
            MemorySegment outEngine) {
        return guard(() -> {
            MemorySegment out = buffer(outEngine, 8, "out_engine");
            java.util.function.Function<io.pegaflow.engine.pool.HostPool, io.pegaflow.engine.transfer.TransferEngine> copies =
                    switch (transfer) {
                        case 0 -> pool -> new io.pegaflow.engine.transfer.HostTransferEngine(pool, Math.max(1, copyThreads));
                        case 1 -> pool -> CudaTransferEngine.create(pool, CudaOptions.defaults().withDevice(device));
                        default -> throw new InvalidArgumentException("transfer " + transfer + "; expected 0 (host) or 1 (cuda)");
                    };
            io.pegaflow.client.EngineClient.Connection c = io.pegaflow.client.EngineClient.open(str(endpoint, "endpoint"),
                    copies, deadlineMs > 0 ? deadlineMs : 5000, Marshal.joinSecret());
            long handle = ENGINES.add(c.engine());
            SERVER_IDS.put(handle, c.serverId());
            out.set(JAVA_LONG, 0, handle);
        });
    }

    /** The server process behind each connected engine (engine_connect). */
    private static final Map<Long, String> SERVER_IDS = new ConcurrentHashMap<>();

    /**
     * The id of the server process a connected engine talks to ("" for an embedded engine);
     * it changes on every server start.
     */
    static int pfEngineServerId(long engine, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> {
            engine(engine);
            putText(SERVER_IDS.getOrDefault(engine, "").getBytes(StandardCharsets.UTF_8), buf, cap, outLen, "server id");
        });
    }

    /** {@code register_worker}'s layer arguments (names '\n'-separated, 7 int64 per layer) as regions. */
    /** {@code n} names ('\n'-separated) and {@code n} rows of {@code width} int64: register_worker's and register_rank's tables. */
    private record Table(String[] names, long[] params) {}

    /** Reads such a table, the count checked before anything is read or allocated. */
    private static Table table(String call, String countArg, int n, MemorySegment names, String namesArg,
            MemorySegment params, String paramsArg, int width) {
        if (n < 1 || n > Limits.MAX_LAYERS_PER_WORKER) {
            throw new InvalidArgumentException(call + ": " + countArg + " " + n + "; expected 1.." + Limits.MAX_LAYERS_PER_WORKER
                    + " (Limits.MAX_LAYERS_PER_WORKER)");
        }
        String[] list = str(names, namesArg).split("\n", -1);
        if (list.length != n) {
            throw new InvalidArgumentException(call + ": " + countArg + " " + n + " but " + list.length + " names in "
                    + namesArg + "; expected equal");
        }
        return new Table(list, Marshal.longs(params, n * width, Limits.MAX_LAYERS_PER_WORKER * width,
                "Limits.MAX_LAYERS_PER_WORKER x " + width, paramsArg));
    }

    static List<LayerRegion> regions(int numLayers, MemorySegment layerNames, MemorySegment layerParams) {
        Table t = table("register_worker", "num_layers", numLayers, layerNames, "layer_names", layerParams, "layer_params",
                LAYER_PARAMS);
        String[] names = t.names();
        long[] p = t.params();
        List<LayerRegion> regions = new ArrayList<>();
        KvLayout[] layouts = KvLayout.values();
        for (int i = 0; i < numLayers; i++) {
            int at = i * LAYER_PARAMS;
            if (p[at] < 0 || p[at] >= layouts.length) {
                throw new InvalidArgumentException("layer '" + names[i] + "': layout " + p[at]
                        + "; expected 0 (SPLIT_KV), 1 (COMBINED) or 2 (MLA)");
            }
            if (p[at + 3] > Integer.MAX_VALUE) {
                throw new InvalidArgumentException("layer '" + names[i] + "': numBlocks " + p[at + 3] + " too large");
            }
            regions.add(new LayerRegion(names[i], layouts[(int) p[at]], p[at + 1], p[at + 2], (int) p[at + 3],
                    p[at + 4], p[at + 5], p[at + 6]));
        }
        return regions;
    }
}
