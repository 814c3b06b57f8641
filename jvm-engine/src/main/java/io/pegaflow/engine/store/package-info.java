/**
 * The store arena: {@link io.pegaflow.engine.store.LocalStore}, the control plane of the block
 * store, with its one lock ({@code StoreLock}) and the named parts that keep their state under
 * it and have no lock of their own.
 *
 * <ul>
 *   <li>{@code PoolSpace}: pool offsets, allocation and eviction ({@code LruList},
 *       {@code CachePolicy}), sealing; the blocks ({@code Block}) and their index per
 *       namespace ({@code NamespaceIndex}, {@code BlockTable}, {@code HashKey},
 *       {@code NamespaceLayout}).
 *   <li>{@code SavePath} and {@code LoadPath}: the write and read paths; {@code LeaseTable}
 *       ({@code Lease}) holds a query's prefix for its loads.
 *   <li>{@code OpenCopies} ({@code OpenCopy}): saves and loads between their plan and their end,
 *       and the orphans of unregistered instances.
 *   <li>{@code SsdReadBack}: the SSD tier below the pool.
 *   <li>{@code PeerShare}: other hosts' pools ({@link io.pegaflow.engine.store.RemoteTier},
 *       {@link io.pegaflow.engine.store.TransferPin},
 *       {@link io.pegaflow.engine.store.FetchReservation},
 *       {@link io.pegaflow.engine.store.BlockChecksum}, {@code BlockChecksums}).
 *   <li>{@code OperatorOps} ({@code AdminPins}): the operator's calls.
 *   <li>{@code InstanceRegistry} ({@code Instance}): the registered instances and their
 *       topologies; {@link io.pegaflow.engine.store.Quotas}: what they may hold;
 *       {@link io.pegaflow.engine.store.KvEventLog}: what happened to the blocks.
 * </ul>
 *
 * <p>Why a package of its own: the parts are package-private and may only be called with the
 * store's lock held (or take it themselves). In a package with the rest of the engine
 * ({@link io.pegaflow.engine.PegaEngine}, the copy engines, the pool mapping) any of those
 * could reach a part without the lock; here only the store and its parts can, and what leaves
 * the package is {@code LocalStore}'s public methods and the types they take and return.
 * The engine's vocabulary (specs, plans, tokens, hashes, limits, exceptions) stays in
 * {@code io.pegaflow.engine}, whose {@code package-info.java} describes the model and its
 * invariants. One member is public only for that package: {@code CachePolicy.check}, with
 * which {@link io.pegaflow.engine.EngineConfig} checks its admission and eviction flags.
 */
package io.pegaflow.engine.store;
