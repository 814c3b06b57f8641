/**
 * The PegaFlow-JVM engine: a content-addressed store of vLLM KV-cache blocks in one host pool.
 *
 * <h2>Model</h2>
 * <pre>
 *  Instance (id, namespace, tpSize, worldSize)
 *    └─ Worker rank r (tpRank, device) ── LayerRegion per layer: base + b*blockStride + s*segmentOffset
 *
 *  NamespaceIndex (namespace) ── HashKey (vLLM block hash bytes) ──> Block
 *    Block: slot per (layerId, tpRank), slot = layerId * tpSize + tpRank
 *           each slot = 1 or 2 segments of segmentBytes at an offset in the HostPool
 *
 *  HostPool (one mmap'd region, owns its Arena) ── OffsetAllocator (offsets, O(1))
 *  Lease (16 bytes) ── pins Block[] of a query's hit prefix; one share per worker
 * </pre>
 *
 * <h2>Invariants (checked by {@link io.pegaflow.engine.PegaEngine#verifyInvariants()})</h2>
 * <ul>
 *   <li>Layer ids are the ranks of the sorted layer names, so every instance registering the
 *       same layers derives the same slots (needed to reuse blocks across restarts).</li>
 *   <li>A block is visible to queries only once sealed: every (layer, TP rank) slot saved.
 *       Saving a resident hash, or a slot already saved or being saved, is a no-op.</li>
 *   <li>{@code refs} of a block counts leases, loads and saves using it, and an operator's
 *       pin ({@code AdminPins}, at most half the pool). A block is on the
 *       LRU list exactly when it is sealed and unreferenced; eviction takes only from that
 *       list and only when an allocation fails. So a leased, loading or saving block is
 *       never evicted.</li>
 *   <li>Pool accounting is exact: the bytes of all blocks equal the allocator's used bytes,
 *       and {@code close()} fails if anything is left over.</li>
 *   <li>Every public call validates its arguments before touching state; a rejected call
 *       leaves index, leases and pool as they were (a save refused for lack of space
 *       evicts nothing unless the space exists, modulo fragmentation).</li>
 *   <li>Every count and length a caller supplies is capped ({@link io.pegaflow.engine.Limits}),
 *       checked before anything is allocated for it: pegaflow-server's clients are mutually
 *       untrusted processes.</li>
 * </ul>
 *
 * <h2>Threads</h2>
 * Metadata changes run under one engine lock and never wait for copies. The lock is
 * {@link io.pegaflow.engine.store.LocalStore}'s ({@code StoreLock}); the state it guards lives in
 * package-private collaborators ({@code InstanceRegistry}, {@code LeaseTable}, {@code LruList},
 * {@code OpenCopy}, and those the store aggregates: {@code PoolSpace}, {@code SavePath},
 * {@code LoadPath}, {@code OpenCopies}, {@code SsdReadBack}, {@code PeerShare},
 * {@code OperatorOps}) that have no lock of their own: they run under that one. The store,
 * its lock and those parts (with the blocks, the index and the leases of the model above) are
 * a package of their own, {@code io.pegaflow.engine.store}, so nothing else in the engine can
 * reach a part without the lock; this package keeps the vocabulary they share with callers
 * (specs, plans, tokens, hashes, limits, exceptions) and {@link io.pegaflow.engine.PegaEngine}.
 * Copies run on the {@link io.pegaflow.engine.transfer.TransferEngine}'s threads and commit
 * under the lock. The optional sweeper thread expires leases (TTL) and drops partially saved
 * blocks.
 */
package io.pegaflow.engine;
