package io.pegaflow.engine.store;

import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PermissionDeniedException;
import io.pegaflow.engine.WorkerSpec;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * A registered instance: its workers as they arrive and, once all {@code worldSize} are in,
 * its sealed topology. Guarded by the store lock.
 */
final class Instance {
    final InstanceSpec spec;
    final Worker[] workers;
    /** The tenant its saves count against ({@link Quotas#tenantPoolBytes}; -1: none). Under the store's lock. */
    int owner = -1;
    int registeredWorkers;
    /** Non-null once sealed. */
    NamespaceIndex ns;
    Map<String, Integer> layerIds;
    boolean removed;
    /** Live leases and the blocks they hold ({@link LeaseTable} keeps these), and open copies ({@link Quotas}). */
    int leases;
    long leasedBlocks;
    int openCopies;

    Instance(InstanceSpec spec) {
        this.spec = spec;
        this.workers = new Worker[spec.worldSize()];
    }

    boolean sealed() {
        return ns != null;
    }

    /**
     * Ids are unguessable, and bound too: a lease or copy ({@code what}) acts only for the
     * instance it was issued to (this one), so one tenant holding another's id still cannot
     * end, load or release it.
     */
    void checkOwner(String instanceId, String what) {
        if (!spec.instanceId().equals(instanceId)) {
            throw new PermissionDeniedException(what + " was not issued to instance '" + instanceId + "'; refused");
        }
    }

    /**
     * A registered worker and, after sealing, for each of its regions: the layer id and the
     * slot of a block it fills ({@code layout.slot(layerId, tpRank)}); with each region's
     * slot size, what every save and load plan reads per region, computed once here.
     */
    static final class Worker {
        final WorkerSpec spec;
        final LayerRegion[] regions;
        final long[] slotBytes;
        int[] layerIds;
        int[] slots;

        Worker(WorkerSpec spec) {
            this.spec = spec;
            this.regions = spec.layers().toArray(new LayerRegion[0]);
            this.slotBytes = new long[regions.length];
            for (int r = 0; r < regions.length; r++) {
                slotBytes[r] = regions[r].slotBytes();
            }
        }

        /** Indexes into {@link #regions} of the named layers ({@code null}: all), in the order named. */
        int[] selectRegions(String instanceId, List<String> layerNames) {
            if (layerNames == null) {
                int[] all = new int[regions.length];
                Arrays.setAll(all, i -> i);
                return all;
            }
            int[] idx = new int[layerNames.size()];
            Set<String> seen = new HashSet<>();
            for (int i = 0; i < idx.length; i++) {
                String name = layerNames.get(i);
                if (!seen.add(name)) {
                    throw new InvalidArgumentException("layer '" + name + "' listed twice in one save");
                }
                idx[i] = -1;
                for (int r = 0; r < regions.length; r++) {
                    if (regions[r].layerName().equals(name)) {
                        idx[i] = r;
                    }
                }
                if (idx[i] < 0) {
                    throw new InvalidArgumentException("layer '" + name + "' is not registered by worker "
                            + spec.workerRank() + " of instance '" + instanceId + "'");
                }
            }
            return idx;
        }

        /** {@link LayerRegion#checkBlockIds} over this worker's regions. */
        void checkBlockIds(int[] regionIdx, long[] ids, String what) {
            LayerRegion.checkBlockIds(regions, regionIdx, ids, what);
        }
    }
}
