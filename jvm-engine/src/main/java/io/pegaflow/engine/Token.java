package io.pegaflow.engine;

import java.nio.ByteBuffer;
import java.security.SecureRandom;
import java.util.HexFormat;

/**
 * A 128-bit id a client can name (a lease, an open save or load), drawn from a CSPRNG so it
 * cannot be guessed from another one, as it crosses the bridge and the wire. The store also
 * binds each to the instance it was issued to: knowing an id is not enough to act on it.
 */
public record Token(long high, long low) {
    public static final int BYTES = 16;
    /** No id (a plan with nothing to copy). */
    public static final Token NONE = new Token(0, 0);

    /** A fresh id from {@code random} (never {@link #NONE}). */
    public static Token random(SecureRandom random) {
        Token t;
        do {
            t = new Token(random.nextLong(), random.nextLong());
        } while (t.equals(NONE));
        return t;
    }

    public static Token fromBytes(byte[] bytes) {
        return fromBytes(bytes, "lease");
    }

    /** {@code what} names the id in the error (e.g. "lease", "copy id"). */
    public static Token fromBytes(byte[] bytes, String what) {
        if (bytes == null || bytes.length != BYTES) {
            throw new InvalidArgumentException(what + " of " + (bytes == null ? "null" : bytes.length + " bytes")
                    + "; expected exactly " + BYTES + " bytes");
        }
        ByteBuffer b = ByteBuffer.wrap(bytes);
        return new Token(b.getLong(), b.getLong());
    }

    public byte[] toBytes() {
        return ByteBuffer.allocate(BYTES).putLong(high).putLong(low).array();
    }

    @Override
    public String toString() {
        return HexFormat.of().formatHex(toBytes());
    }
}
