package io.pegaflow.engine;

import io.pegaflow.engine.store.LocalStore;
import java.util.List;
import java.util.Random;

/** Control-plane steps for store tests that plan and end copies without moving a byte. */
final class PlanOnly {
    private PlanOnly() {}

    /** Registers a one-rank instance whose one MLA layer has {@code blocks} blocks of {@code seg} bytes. */
    static void register(LocalStore store, String id, String namespace, long seg, int blocks) {
        store.registerInstance(new InstanceSpec(id, namespace, 1, 1));
        store.registerWorker(id, new WorkerSpec(0, 0, 0, List.of(new LayerRegion("l", KvLayout.MLA, 1L << 32, blocks * seg, blocks,
                seg, seg, 0))));
    }

    /** {@code n} random 32-byte hashes. */
    static BlockHashes hashes(Random rnd, int n) {
        byte[][] h = new byte[n][32];
        for (byte[] x : h) {
            rnd.nextBytes(x);
        }
        return BlockHashes.of(h);
    }

    /** Saves {@code h} from blocks 0.. of {@code id}: planned, then ended as copied. */
    static void saved(LocalStore store, String id, BlockHashes h) {
        long[] ids = new long[h.count()];
        for (int i = 0; i < ids.length; i++) {
            ids[i] = i;
        }
        CopyPlan p = store.reserveSave(id, 0, null, ids, h);
        if (!p.isEmpty()) { // a save with nothing to write opens no copy
            store.endCopy(id, p.id(), true, 0, 0);
        }
    }
}
