package io.pegaflow.engine;

import java.util.List;

/**
 * The control plane as workers use it: in this process ({@link LocalStore}) or across a
 * socket (pegaflow-server's client). It decides which pool offsets a save writes and a load
 * reads; the caller moves the bytes between its own regions and its mapping of the pool.
 * Semantics, errors and invariants are those of {@link LocalStore}.
 */
public interface BlockStore extends AutoCloseable {
    void registerInstance(InstanceSpec spec);

    void registerWorker(String instanceId, WorkerSpec worker);

    boolean isSealed(String instanceId);

    void unregisterInstance(String instanceId);

    SavePlan reserveSave(String instanceId, int workerRank, List<String> layerNames, long[] blockIds, byte[][] hashes);

    SaveResult commitSave(long reservationId, boolean ok, long bytes, long nanos);

    QueryResult query(String instanceId, byte[][] hashes);

    /** The same query over {@code hashLen}-byte hashes packed back to back. */
    QueryResult query(String instanceId, byte[] packed, int hashLen);

    void release(LeaseId lease);

    LoadPlan beginLoad(String instanceId, int workerRank, LeaseId lease, long[] dstBlockIds);

    LoadResult endLoad(long loadId, boolean ok, long bytes, long nanos);

    EngineStats stats();

    @Override
    void close();
}
