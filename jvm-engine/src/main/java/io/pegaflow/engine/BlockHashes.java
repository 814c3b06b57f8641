package io.pegaflow.engine;

import java.util.Arrays;
import java.util.HexFormat;

/**
 * vLLM block hashes in their one form from the step plan to the index: {@code count()} hashes
 * of {@code hashLen} bytes each, packed back to back. The store never splits them into
 * per-hash arrays; it reads each window in place. Callers must not modify {@code packed}
 * after handing it over. At most {@link Limits#MAX_HASHES_PER_CALL} hashes.
 */
public record BlockHashes(byte[] packed, int hashLen) {
    /** No hashes. */
    public static final BlockHashes EMPTY = new BlockHashes(new byte[0], 0);

    public BlockHashes {
        if (packed == null) {
            throw new InvalidArgumentException("hashes are null; expected packed hash bytes");
        }
        if (packed.length > 0 && (hashLen < 1 || hashLen > Limits.MAX_HASH_BYTES || packed.length % hashLen != 0)) {
            throw new InvalidArgumentException(packed.length + " bytes of hashes with hash_len " + hashLen
                    + "; expected 1 <= hash_len <= " + Limits.MAX_HASH_BYTES + " dividing the byte count");
        }
        Limits.checkHashes(packed.length, hashLen);
    }

    /**
     * Hashes of one length given separately (tests, and hosts that hold them that way);
     * product paths receive them packed.
     */
    public static BlockHashes of(byte[]... hashes) {
        if (hashes == null) {
            throw new InvalidArgumentException("hashes are null; expected an array of hashes");
        }
        if (hashes.length == 0) {
            return EMPTY;
        }
        Limits.checkCount("hashes in one call", hashes.length, Limits.MAX_HASHES_PER_CALL, "MAX_HASHES_PER_CALL");
        int len = hashes[0] == null ? 0 : hashes[0].length;
        byte[] out = new byte[hashes.length * len];
        for (int i = 0; i < hashes.length; i++) {
            validate(hashes[i], i, "hashes");
            if (hashes[i].length != len) {
                throw new InvalidArgumentException("hashes[" + i + "] is " + hashes[i].length + " bytes but hashes[0] is "
                        + len + "; expected one length per call");
            }
            System.arraycopy(hashes[i], 0, out, i * len, len);
        }
        return new BlockHashes(out, len);
    }

    /** Checks one hash of a request; {@code index} and {@code what} name it in the message. */
    private static void validate(byte[] hash, int index, String what) {
        if (hash == null || hash.length == 0 || hash.length > Limits.MAX_HASH_BYTES) {
            throw new InvalidArgumentException(what + "[" + index + "] is "
                    + (hash == null ? "null" : hash.length + " bytes") + "; expected 1.." + Limits.MAX_HASH_BYTES + " bytes");
        }
    }

    public int count() {
        return packed.length == 0 ? 0 : packed.length / hashLen;
    }

    /** Hashes {@code [from, to)} as their own packed array. */
    public BlockHashes slice(int from, int to) {
        if (from < 0 || to < from || to > count()) {
            throw new InvalidArgumentException("hash range [" + from + ", " + to + ") of " + count() + " hashes");
        }
        return from == 0 && to == count() ? this
                : new BlockHashes(Arrays.copyOfRange(packed, from * hashLen, to * hashLen), to == from ? 0 : hashLen);
    }

    /** Whether these hashes are exactly hashes {@code [from, from + count())} of {@code other} (no copies). */
    public boolean sameAs(BlockHashes other, int from) {
        int n = count();
        if (n == 0 || hashLen != other.hashLen || from < 0 || from + n > other.count()) {
            return n == 0 && from >= 0 && from <= other.count();
        }
        return Arrays.equals(packed, 0, packed.length, other.packed, from * hashLen, (from + n) * hashLen);
    }

    /** Hash {@code i}, hex (messages). */
    public String hex(int i) {
        return HexFormat.of().formatHex(packed, i * hashLen, (i + 1) * hashLen);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof BlockHashes h && h.hashLen == hashLen && Arrays.equals(h.packed, packed);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(packed) * 31 + hashLen;
    }

    @Override
    public String toString() {
        return count() + " hashes of " + hashLen + " bytes";
    }
}
