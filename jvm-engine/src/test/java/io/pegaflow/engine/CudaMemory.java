package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaDriver;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

/** GPU memory for the GPU tier: cuMemAlloc, read and written with synchronous copies. */
final class CudaMemory implements DeviceMemory {
    private final CudaDevice device;
    private final List<Long> allocations = new ArrayList<>();

    CudaMemory(int ordinal) {
        this.device = CudaDevice.open(ordinal);
    }

    @Override
    public synchronized long allocate(long bytes) {
        device.makeCurrent();
        long p = CudaDriver.memAlloc(bytes);
        allocations.add(p);
        return p;
    }

    @Override
    public void write(long address, byte[] data) {
        device.makeCurrent();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment host = a.allocate(data.length);
            MemorySegment.copy(data, 0, host, ValueLayout.JAVA_BYTE, 0, data.length);
            CudaDriver.memcpyHtoD(address, host.address(), data.length);
        }
    }

    @Override
    public byte[] read(long address, int length) {
        device.makeCurrent();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment host = a.allocate(length);
            CudaDriver.memcpyDtoH(host.address(), address, length);
            return host.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    @Override
    public synchronized void close() {
        device.makeCurrent();
        for (long p : allocations) {
            CudaDriver.memFree(p);
        }
        allocations.clear();
        device.close();
    }
}
