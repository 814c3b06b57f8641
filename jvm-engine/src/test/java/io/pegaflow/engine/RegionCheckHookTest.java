package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * {@link PegaEngine#registerWorker} asks the copy engine about every region before the control
 * plane sees any; a refused region registers nothing.
 */
class RegionCheckHookTest {

    /** Host copies that refuse one named layer and record what they were asked. */
    private static final class Refusing implements TransferEngine {
        final TransferEngine host;
        final String refused;
        final List<String> checked = new ArrayList<>();

        Refusing(TransferEngine host, String refused) {
            this.host = host;
            this.refused = refused;
        }

        @Override
        public void checkRegion(LayerRegion region) {
            checked.add(region.layerName());
            if (region.layerName().equals(refused)) {
                throw new InvalidArgumentException("layer '" + refused + "': refused by the test engine");
            }
        }

        @Override
        public TransferFuture submit(CopyBatch batch) {
            return host.submit(batch);
        }

        @Override
        public String name() {
            return "refusing";
        }

        @Override
        public void close() {
            host.close();
        }
    }

    @Test
    void aRefusedRegionRegistersNothing() {
        List<Refusing> made = new ArrayList<>();
        EngineConfig config = EngineConfig.builder().poolSize("1mb").transfer(pool -> {
            Refusing r = new Refusing(new HostTransferEngine(pool, 1), "l1");
            made.add(r);
            return r;
        }).build();
        try (DeviceMemory mem = DeviceMemory.host(); PegaEngine engine = PegaEngine.create(config)) {
            engine.registerInstance(new InstanceSpec("i", "ns", 1, 1));
            long a = mem.allocate(8192);
            LayerRegion l0 = new LayerRegion("l0", KvLayout.COMBINED, a, 4096, 4, 1024, 1024, 0);
            LayerRegion l1 = new LayerRegion("l1", KvLayout.COMBINED, a + 4096, 4096, 4, 1024, 1024, 0);
            assertThatThrownBy(() -> engine.registerWorker("i", new WorkerSpec(0, 0, 0, List.of(l0, l1))))
                    .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("layer 'l1': refused");
            assertThat(made.get(0).checked).containsExactly("l0", "l1");
            assertThat(engine.isSealed("i")).as("the refused worker was not registered").isFalse();

            engine.registerWorker("i", new WorkerSpec(0, 0, 0, List.of(l0)));
            assertThat(engine.isSealed("i")).isTrue();
        }
    }
}
