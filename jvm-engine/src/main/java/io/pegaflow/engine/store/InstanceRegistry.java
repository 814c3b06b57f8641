package io.pegaflow.engine.store;

import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.RegistrationIncompleteException;
import io.pegaflow.engine.TopologyMismatchException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.WorkerSpec;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The registered instances by id and the namespaces their sealed topologies share: registration,
 * sealing (layer ids, owners, one layout per namespace), lookups that throw the typed exceptions,
 * removal. Not thread-safe: guarded by LocalStore's lock.
 */
final class InstanceRegistry {
    private final Map<String, Instance> instances = new HashMap<>();
    private final Map<String, NamespaceIndex> namespaces = new HashMap<>();

    /**
     * Registers an instance. The same spec again is a no-op; the same id with a different spec
     * is a {@link TopologyMismatchException}.
     */
    void register(InstanceSpec spec) {
        Instance existing = instances.get(spec.instanceId());
        if (existing != null) {
            if (existing.spec.equals(spec)) {
                return;
            }
            throw new TopologyMismatchException("instance '" + spec.instanceId() + "' is registered as " + existing.spec
                    + "; re-registration asked for " + spec);
        }
        instances.put(spec.instanceId(), new Instance(spec));
    }

    /**
     * Adds a checked worker to its instance and seals the instance when it is the last one;
     * a worker the seal rejects is not kept.
     */
    void addWorker(String instanceId, WorkerSpec worker) {
        Instance inst = get(instanceId);
        if (inst.sealed()) {
            throw new InvalidArgumentException("instance '" + instanceId + "' is already sealed: all "
                    + inst.spec.worldSize() + " workers registered");
        }
        int rank = worker.workerRank();
        if (rank < 0 || rank >= inst.spec.worldSize()) {
            throw new InvalidArgumentException("worker rank " + rank + " out of range [0, " + inst.spec.worldSize()
                    + ") for instance '" + instanceId + "'");
        }
        if (worker.tpRank() < 0 || worker.tpRank() >= inst.spec.tpSize()) {
            throw new InvalidArgumentException("tp rank " + worker.tpRank() + " out of range [0, "
                    + inst.spec.tpSize() + ") for instance '" + instanceId + "'");
        }
        if (inst.workers[rank] != null) {
            throw new InvalidArgumentException("worker rank " + rank + " of instance '" + instanceId
                    + "' is already registered");
        }
        inst.workers[rank] = new Instance.Worker(worker);
        inst.registeredWorkers++;
        if (inst.registeredWorkers == inst.spec.worldSize()) {
            try {
                seal(inst);
            } catch (RuntimeException e) {
                inst.workers[rank] = null;
                inst.registeredWorkers--;
                throw e;
            }
        }
    }

    private void seal(Instance inst) {
        int tp = inst.spec.tpSize();
        TreeMap<String, NamespaceLayout.LayerGeometry> geometry = new TreeMap<>();
        Map<String, int[]> owners = new HashMap<>();
        for (Instance.Worker w : inst.workers) {
            for (LayerRegion r : w.regions) {
                NamespaceLayout.LayerGeometry g =
                        new NamespaceLayout.LayerGeometry(r.layerName(), r.layout(), r.segmentBytes());
                NamespaceLayout.LayerGeometry prev = geometry.putIfAbsent(r.layerName(), g);
                if (prev != null && !prev.equals(g)) {
                    throw new TopologyMismatchException("layer '" + r.layerName() + "' of instance '" + inst.spec.instanceId()
                            + "' is " + prev.layout() + " with segmentBytes " + prev.segmentBytes() + " on one rank but "
                            + g.layout() + " with segmentBytes " + g.segmentBytes() + " on worker " + w.spec.workerRank()
                            + "; expected the same geometry on every rank");
                }
                int[] byTp = owners.computeIfAbsent(r.layerName(), k -> {
                    int[] a = new int[tp];
                    Arrays.fill(a, -1);
                    return a;
                });
                int tpRank = w.spec.tpRank();
                // MLA latents are identical on every TP rank: workers registering the same
                // (layer, tp rank) are replicas that share one stored copy (the first save
                // to claim a slot writes it, the others skip it).
                if (byTp[tpRank] >= 0 && r.layout() != KvLayout.MLA) {
                    throw new TopologyMismatchException("layer '" + r.layerName() + "' tp rank " + tpRank + " of instance '"
                            + inst.spec.instanceId() + "' is registered by workers " + byTp[tpRank] + " and "
                            + w.spec.workerRank() + "; expected exactly one owner");
                }
                byTp[tpRank] = w.spec.workerRank();
            }
        }
        for (Map.Entry<String, int[]> e : owners.entrySet()) {
            for (int t = 0; t < tp; t++) {
                if (e.getValue()[t] < 0) {
                    throw new TopologyMismatchException("layer '" + e.getKey() + "' of instance '" + inst.spec.instanceId()
                            + "' has no worker for tp rank " + t + "; expected every layer on every tp rank");
                }
            }
        }
        NamespaceLayout layout = new NamespaceLayout(tp, List.copyOf(geometry.values()));
        NamespaceIndex ns = namespaces.get(inst.spec.namespace());
        if (ns != null && !ns.layout.equals(layout)) {
            // Another tenant's geometry is its own: the message gives only the caller's.
            throw new TopologyMismatchException("namespace '" + inst.spec.namespace() + "' is shared by incompatible KV layouts: "
                    + "instance '" + inst.spec.instanceId() + "' registers " + layout + ", which differs from the layout "
                    + "the namespace's blocks were stored with; expected one layout per namespace (another model, dtype or "
                    + "TP size needs another namespace)");
        }
        Map<String, Integer> ids = new HashMap<>();
        int id = 0;
        for (String name : geometry.keySet()) {
            ids.put(name, id++);
        }
        for (Instance.Worker w : inst.workers) {
            w.layerIds = new int[w.regions.length];
            w.slots = new int[w.regions.length];
            for (int i = 0; i < w.regions.length; i++) {
                w.layerIds[i] = ids.get(w.regions[i].layerName());
                w.slots[i] = layout.slot(w.layerIds[i], w.spec.tpRank());
            }
        }
        if (ns == null) {
            ns = new NamespaceIndex(inst.spec.namespace(), layout);
            namespaces.put(ns.namespace, ns);
        }
        inst.layerIds = ids;
        inst.ns = ns;
    }

    boolean contains(String instanceId) {
        return instances.containsKey(instanceId);
    }

    /** The registered instance; {@link UnknownInstanceException} if there is none. */
    Instance get(String instanceId) {
        Instance inst = instances.get(instanceId);
        if (inst == null) {
            // Other instances' ids name other tenants: never listed here.
            throw new UnknownInstanceException("instance '" + instanceId + "' is not registered; register it (and all "
                    + "of its workers) first, or check the id");
        }
        return inst;
    }

    /** The registered, sealed instance; {@link RegistrationIncompleteException} while workers are missing. */
    Instance sealed(String instanceId) {
        Instance inst = get(instanceId);
        if (!inst.sealed()) {
            throw new RegistrationIncompleteException("instance '" + instanceId + "' has " + inst.registeredWorkers
                    + " of " + inst.spec.worldSize() + " workers registered; expected all before save, query or load");
        }
        return inst;
    }

    /** The registered worker of {@code inst}; {@link UnknownInstanceException} if there is none. */
    static Instance.Worker worker(Instance inst, int workerRank) {
        if (workerRank < 0 || workerRank >= inst.workers.length || inst.workers[workerRank] == null) {
            throw new UnknownInstanceException("worker rank " + workerRank + " is not registered in instance '"
                    + inst.spec.instanceId() + "' (world size " + inst.spec.worldSize() + ")");
        }
        return inst.workers[workerRank];
    }

    /** Removes the registered instance and marks it removed; {@link UnknownInstanceException} if there is none. */
    Instance remove(String instanceId) {
        Instance inst = get(instanceId);
        instances.remove(instanceId);
        inst.removed = true;
        return inst;
    }

    /** Registered instance ids, sorted. */
    List<String> ids() {
        List<String> ids = new ArrayList<>(instances.keySet());
        ids.sort(null);
        return ids;
    }

    /** The namespace named {@code name}, or null when no sealed instance created it. */
    NamespaceIndex namespace(String name) {
        return namespaces.get(name);
    }

    /** Every namespace a sealed instance has created (namespaces outlive their instances). */
    Collection<NamespaceIndex> namespaces() {
        return namespaces.values();
    }

}
