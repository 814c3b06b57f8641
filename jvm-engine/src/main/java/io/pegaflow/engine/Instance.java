package io.pegaflow.engine;

import java.util.Map;

/**
 * A registered instance: its workers as they arrive and, once all {@code worldSize} are in,
 * its sealed topology. Guarded by the store lock.
 */
final class Instance {
    final InstanceSpec spec;
    final Worker[] workers;
    int registeredWorkers;
    /** Non-null once sealed. */
    NamespaceIndex ns;
    Map<String, Integer> layerIds;
    boolean removed;

    Instance(InstanceSpec spec) {
        this.spec = spec;
        this.workers = new Worker[spec.worldSize()];
    }

    boolean sealed() {
        return ns != null;
    }

    /** A registered worker and, after sealing, the layer id of each of its regions. */
    static final class Worker {
        final WorkerSpec spec;
        final LayerRegion[] regions;
        int[] layerIds;

        Worker(WorkerSpec spec) {
            this.spec = spec;
            this.regions = spec.layers().toArray(new LayerRegion[0]);
        }
    }
}
