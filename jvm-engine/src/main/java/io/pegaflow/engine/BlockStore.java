package io.pegaflow.engine;

import io.pegaflow.engine.store.KvEventLog;
import io.pegaflow.engine.store.LocalStore;
import java.util.List;

/**
 * The control plane as workers use it: in this process ({@link LocalStore}) or across a
 * socket (pegaflow-server's client). It decides which pool offsets a save writes and a load
 * reads ({@link CopyPlan}); the caller moves the bytes between its own regions and its
 * mapping of the pool, then ends the plan with {@link #endCopy}. Semantics, errors and
 * invariants are those of {@link LocalStore}; {@code BlockStoreContract} checks both
 * implementations against one suite.
 */
public interface BlockStore extends AutoCloseable {
    void registerInstance(InstanceSpec spec);

    void registerWorker(String instanceId, WorkerSpec worker);

    boolean isSealed(String instanceId);

    void unregisterInstance(String instanceId);

    /** Claims pool space for the worker's slots of {@code blockIds[i]} under hash {@code i}. */
    CopyPlan reserveSave(String instanceId, int workerRank, List<String> layerNames, long[] blockIds, BlockHashes hashes);

    /** Consumes the worker's share of {@code lease}; the plan reads the leased blocks into {@code dstBlockIds}. */
    CopyPlan beginLoad(String instanceId, int workerRank, Token lease, long[] dstBlockIds);

    /**
     * {@link #beginLoad(String, int, Token, long[])} whose plan holds the runs of the first
     * {@code planBlocks} leased blocks only (all of them if there are fewer); {@link #planRest}
     * gives the others. Pins every leased block and consumes the share as the full call does.
     */
    CopyPlan beginLoad(String instanceId, int workerRank, Token lease, long[] dstBlockIds, int planBlocks);

    /**
     * The runs of an open load of {@code workerRank} for its leased blocks {@code fromBlock ..
     * toBlock - 1} (the same plan id; ended once by {@link #endCopy}).
     */
    CopyPlan planRest(String instanceId, int workerRank, Token planId, int fromBlock, int toBlock);

    /**
     * Ends an open save (its slots become filled, or are rolled back when {@code !ok}) or an
     * open load (its blocks are unpinned). {@code bytes} and {@code nanos} describe the copy.
     * Only the instance the plan was issued to may end it; one never ended is rolled back
     * after the copy TTL, or when its plan's hold ends if its instance is unregistered
     * ({@link CopyPlan#holdNanos}).
     */
    CopyResult endCopy(String instanceId, Token planId, boolean ok, long bytes, long nanos);

    /**
     * Rolls back a load {@link #queryAndBegin} began that no copy took (its lease released
     * instead), counted as unused rather than failed; any other copy is refused. A store that
     * cannot tell (an older server) ends it as a failed load.
     */
    void dropBegun(String instanceId, Token planId);

    QueryResult query(String instanceId, BlockHashes hashes);

    /**
     * {@link #query} that, on a final hit, also begins worker {@code workerRank}'s load of the
     * leased blocks as {@link #beginLoad} would (its share consumed, the blocks pinned, the
     * load open until {@link #endCopy}), with the destination block ids left to the copier,
     * which checks them against its own regions: the answer's {@link QueryResult#begun} is that
     * load's whole plan. One call where a lookup and its load's plan took two (in server mode,
     * one round trip of the local socket instead of two in the step that loads). {@code begun}
     * is null where the store began none: no hit, "not yet", the plan over {@link
     * Limits#MAX_PLAN_SLOTS}, the open-copy quota reached, or a store that does not begin loads
     * at a query; the worker's load then asks with {@link #beginLoad} and meets any refusal
     * there. A rank the instance does not have is refused (nothing leased).
     */
    QueryResult queryAndBegin(String instanceId, BlockHashes hashes, int workerRank);

    /** {@link #queryAndBegin}'s rank, checked where the call enters (engine, store, client). */
    static void checkBeginRank(int workerRank) {
        if (workerRank < 0) {
            throw new InvalidArgumentException("query: worker rank " + workerRank + " to begin a load for; expected >= 0");
        }
    }

    /** Drops a lease of {@code instanceId} (a lease of another instance is refused). */
    void release(String instanceId, Token lease);

    EngineStats stats();

    /**
     * vLLM's {@code reset_cache}: drops the resident blocks of the instance's namespace that no
     * lease, load or save holds, and the namespace's SSD records ({@link LocalStore#clear}).
     * Other instances of the namespace lose them too: a namespace is one model's cache.
     */
    LocalStore.Cleared resetCache(String instanceId);

    /**
     * The store's block events of the instance's namespace after sequence number {@code after}
     * (0: from the oldest kept), at most {@code max} ({@link KvEventLog#MAX_READ}): what vLLM's
     * KV-event publisher carries for routers. Events of a namespace are the store's, whichever
     * instance caused them: every instance of a model on the host can load those blocks.
     */
    KvEventLog.Batch kvEvents(String instanceId, long after, int max);

    /**
     * A request's retention hint "low": the blocks of {@code hashes} in the instance's
     * namespace (resident or still being saved) go first when the pool needs room, until a
     * query hits them again. Blocks it does not hold are ignored; the number marked.
     */
    int demote(String instanceId, BlockHashes hashes);

    /**
     * The visibility barrier: every save ended before this call is visible to other hosts'
     * queries when it returns (local queries see a save as soon as it ended). Without other
     * hosts it returns at once.
     *
     * @throws PegaflowException TIMEOUT or UNAVAILABLE when the cluster registry did not confirm
     */
    default void flush() {}

    @Override
    void close();
}
