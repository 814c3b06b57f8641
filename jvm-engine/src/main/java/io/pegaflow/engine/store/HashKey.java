package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.HexFormat;

/**
 * vLLM's block hash, owned by the block stored under it (a private copy: callers may reuse
 * their arrays). Lookups go through {@link BlockTable} straight from the caller's bytes;
 * this class serves identity within one request (duplicate detection) and messages.
 */
final class HashKey {
    private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    private final byte[] bytes;
    private final int hash;

    private HashKey(byte[] bytes) {
        this.bytes = bytes;
        if (bytes.length >= 8) {
            long x = (long) LONG.get(bytes, 0); // vLLM hashes are uniform: 8 bytes suffice
            this.hash = (int) (x ^ (x >>> 32));
        } else {
            this.hash = Arrays.hashCode(bytes);
        }
    }

    /** A key holding a copy of {@code bytes}. */
    static HashKey of(byte[] bytes) {
        return new HashKey(bytes.clone());
    }

    /** A key holding a copy of hash {@code i} of {@code hashes}. */
    static HashKey of(BlockHashes hashes, int i) {
        return new HashKey(Arrays.copyOfRange(hashes.packed(), i * hashes.hashLen(), (i + 1) * hashes.hashLen()));
    }

    /** The hash bytes; callers must not modify them. */
    byte[] bytes() {
        return bytes;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof HashKey k && k.hash == hash && Arrays.equals(k.bytes, bytes);
    }

    @Override
    public int hashCode() {
        return hash;
    }

    @Override
    public String toString() {
        return HexFormat.of().formatHex(bytes);
    }
}
