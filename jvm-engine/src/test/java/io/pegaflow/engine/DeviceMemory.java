package io.pegaflow.engine;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Where a test's "device" KV tensors live: host RAM for the CPU tiers, GPU memory for the
 * GPU tier. Tests read and write them only through this interface, so one test body covers
 * both copy engines.
 */
interface DeviceMemory extends AutoCloseable {
    /** Allocates {@code bytes} (64-byte aligned) and returns its address. */
    long allocate(long bytes);

    void write(long address, byte[] data);

    byte[] read(long address, int length);

    @Override
    void close();

    /** Host RAM from one shared arena. */
    static DeviceMemory host() {
        return new DeviceMemory() {
            private final Arena arena = Arena.ofShared();
            private final MemorySegment all = MemorySegment.NULL.reinterpret(Long.MAX_VALUE);

            @Override
            public long allocate(long bytes) {
                return arena.allocate(bytes, 64).address();
            }

            @Override
            public void write(long address, byte[] data) {
                MemorySegment.copy(data, 0, all, ValueLayout.JAVA_BYTE, address, data.length);
            }

            @Override
            public byte[] read(long address, int length) {
                byte[] out = new byte[length];
                MemorySegment.copy(all, ValueLayout.JAVA_BYTE, address, out, 0, length);
                return out;
            }

            @Override
            public void close() {
                arena.close();
            }
        };
    }
}
