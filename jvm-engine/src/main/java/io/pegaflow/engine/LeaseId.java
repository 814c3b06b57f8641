package io.pegaflow.engine;

import java.nio.ByteBuffer;
import java.util.HexFormat;

/** A 16-byte lease token (random, like a UUIDv4) as it crosses the bridge and the wire. */
public record LeaseId(long high, long low) {
    public static final int BYTES = 16;

    public static LeaseId fromBytes(byte[] bytes) {
        if (bytes == null || bytes.length != BYTES) {
            throw new InvalidArgumentException("lease of " + (bytes == null ? "null" : bytes.length + " bytes")
                    + "; expected exactly " + BYTES + " bytes");
        }
        ByteBuffer b = ByteBuffer.wrap(bytes);
        return new LeaseId(b.getLong(), b.getLong());
    }

    public byte[] toBytes() {
        return ByteBuffer.allocate(BYTES).putLong(high).putLong(low).array();
    }

    @Override
    public String toString() {
        return HexFormat.of().formatHex(toBytes());
    }
}
