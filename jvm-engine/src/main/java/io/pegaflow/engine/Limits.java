package io.pegaflow.engine;

/**
 * Caps on every count and length a client supplies. pegaflow-server is shared by mutually
 * untrusted processes, so each is checked before anything is allocated for it or any state
 * changes, and the refusal ({@link InvalidArgumentException}) names the cap, e.g.
 * {@code "worldSize 268435456 of instance 'x'; expected at most 4096 (Limits.MAX_WORLD_SIZE)"}.
 *
 * <p>The caps leave room far beyond real deployments (vLLM: ~100 layers, TP <= 64, a 1M-token
 * prompt is 65,536 hashes at 16 tokens a block) while bounding what one request can make the
 * server hold: the largest request the caps allow ({@code Wire.MAX_REQUEST_BYTES}, derived
 * from them) is the server's gRPC inbound message limit.
 */
public final class Limits {
    /** Tensor-parallel size of one instance. */
    public static final int MAX_TP_SIZE = 4096;
    /** Workers of one instance (TP x PP): the server holds a slot per rank. */
    public static final int MAX_WORLD_SIZE = 4096;
    /** Layers one worker registers. */
    public static final int MAX_LAYERS_PER_WORKER = 16384;
    /**
     * Slots of one cached block (distinct layers x TP size) once an instance seals: every block
     * holds 9 bytes of heap per slot.
     */
    public static final int MAX_SLOTS_PER_BLOCK = 1 << 16;
    /** UTF-8 bytes of an instance id, a namespace or a layer name. */
    public static final int MAX_NAME_BYTES = 256;
    /** Bytes of one block hash. */
    public static final int MAX_HASH_BYTES = 64;
    /**
     * Hashes in one save or query, hence block ids in one save or load (a load's ids pair with
     * its lease's blocks, which a query found): 4M tokens at 16 tokens a block.
     */
    public static final int MAX_HASHES_PER_CALL = 1 << 18;
    /**
     * (block, layer) entries of one copy plan, so that the plan fits the client's 64 MiB
     * inbound message limit (at most ~11 bytes an entry on the wire).
     */
    public static final int MAX_PLAN_SLOTS = 1 << 22;
    /** Characters of a value quoted in a refusal (the rest is elided). */
    static final int QUOTE_CHARS = 48;

    private Limits() {}

    /**
     * Refuses {@code value} when it is longer than {@link #MAX_NAME_BYTES} in UTF-8; null
     * passes (the caller says what null means). {@code what} names it: "instance id".
     */
    public static void checkName(String what, String value) {
        if (value == null || value.length() <= MAX_NAME_BYTES / 3) {
            return; // at most 3 UTF-8 bytes a char
        }
        long bytes = utf8Length(value);
        if (bytes > MAX_NAME_BYTES) {
            throw new InvalidArgumentException(what + " '" + quote(value) + "' is " + bytes
                    + " bytes in UTF-8; expected at most " + MAX_NAME_BYTES + " (Limits.MAX_NAME_BYTES)");
        }
    }

    /**
     * Refuses a name with a control character (NUL, newline, DEL, C1; and the Unicode line and
     * paragraph separators): ids end up in logs, JSON ({@code /instances}) and other tenants'
     * screens. The message gives the character's code point and index, never the character.
     */
    public static void checkPrintable(String what, String value) {
        if (value == null) {
            return;
        }
        for (int i = 0; i < value.length(); i++) {
            char c = value.charAt(i);
            if (Character.isISOControl(c) || c == '\u2028' || c == '\u2029') {
                throw new InvalidArgumentException(what + " of " + value.length() + " characters has U+"
                        + String.format("%04X", (int) c) + " at index " + i
                        + "; expected printable characters (no NUL, newline or other control character)");
            }
        }
    }

    /** Refuses more than {@code cap} items; {@code capName} is the constant's name for the message. */
    public static void checkCount(String what, long count, int cap, String capName) {
        if (count > cap) {
            throw new InvalidArgumentException(what + ": " + count + "; expected at most " + cap + " (Limits." + capName + ")");
        }
    }

    /** Refuses more hashes than {@link #MAX_HASHES_PER_CALL} in {@code bytes} packed bytes of {@code hashLen} each. */
    public static void checkHashes(long bytes, int hashLen) {
        long count = hashLen > 0 ? bytes / hashLen : bytes;
        if (count > MAX_HASHES_PER_CALL) {
            throw new InvalidArgumentException(count + " hashes (" + bytes + " bytes of hash_len " + hashLen
                    + ") in one call; expected at most " + MAX_HASHES_PER_CALL + " (Limits.MAX_HASHES_PER_CALL)");
        }
    }

    /** Refuses a copy plan of {@code blocks} x {@code regions} entries over {@link #MAX_PLAN_SLOTS}. */
    public static void checkPlan(String what, long blocks, long regions) {
        if (blocks * regions > MAX_PLAN_SLOTS) {
            throw new InvalidArgumentException(what + " of " + blocks + " blocks x " + regions + " layers = "
                    + blocks * regions + " copies; expected at most " + MAX_PLAN_SLOTS
                    + " (Limits.MAX_PLAN_SLOTS): split it into several calls");
        }
    }

    /** {@code value}, or its first characters and its length when it is long (messages). */
    public static String quote(String value) {
        if (value == null || value.length() <= QUOTE_CHARS) {
            return value;
        }
        return value.substring(0, QUOTE_CHARS) + "... (" + value.length() + " chars)";
    }

    /** UTF-8 length without encoding (no copy of a client's long string). */
    static long utf8Length(String s) {
        long n = 0;
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c < 0x80) {
                n += 1;
            } else if (c < 0x800) {
                n += 2;
            } else if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                n += 4;
                i++;
            } else {
                n += 3;
            }
        }
        return n;
    }
}
