package io.pegaflow.engine.cuda;

/**
 * One GPU through its primary context (the context PyTorch and vLLM use, so streams and
 * pointers are shared with them). Retained on open, released on close.
 */
public final class CudaDevice implements AutoCloseable {
    private final int ordinal;
    private final int handle;
    private final long context;
    private final String name;
    private final int computeMajor;
    private final int computeMinor;
    private final int multiprocessors;
    private boolean closed;

    private CudaDevice(int ordinal) {
        CudaDriver.ensureLoaded();
        int count = CudaDriver.deviceCount();
        if (ordinal >= count) {
            throw new CudaException("CUDA device " + ordinal + " does not exist; this machine has " + count, -1);
        }
        this.ordinal = ordinal;
        this.handle = CudaDriver.deviceGet(ordinal);
        this.name = CudaDriver.deviceName(handle);
        this.computeMajor = CudaDriver.deviceAttribute(CudaDriver.ATTR_COMPUTE_CAPABILITY_MAJOR, handle);
        this.computeMinor = CudaDriver.deviceAttribute(CudaDriver.ATTR_COMPUTE_CAPABILITY_MINOR, handle);
        this.multiprocessors = CudaDriver.deviceAttribute(CudaDriver.ATTR_MULTIPROCESSOR_COUNT, handle);
        this.context = CudaDriver.primaryCtxRetain(handle);
        makeCurrent();
    }

    /** Opens device {@code ordinal}; throws {@link CudaException} without a driver or device. */
    public static CudaDevice open(int ordinal) {
        return new CudaDevice(ordinal);
    }

    /** Makes this device's primary context current on the calling thread. */
    public void makeCurrent() {
        CudaDriver.ctxSetCurrent(context);
    }

    public int ordinal() {
        return ordinal;
    }

    public int handle() {
        return handle;
    }

    public String name() {
        return name;
    }

    /** e.g. 90 for an H100/H200. */
    public int arch() {
        return computeMajor * 10 + computeMinor;
    }

    public int multiprocessors() {
        return multiprocessors;
    }

    public long context() {
        return context;
    }

    @Override
    public synchronized void close() {
        if (!closed) {
            closed = true;
            CudaDriver.primaryCtxRelease(handle);
        }
    }

    @Override
    public String toString() {
        return name + " (device " + ordinal + ", sm_" + arch() + ", " + multiprocessors + " SMs)";
    }
}
