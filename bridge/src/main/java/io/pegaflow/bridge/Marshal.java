package io.pegaflow.bridge;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.PegaflowException;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * What every export shares: turning C arguments into Java values (with the NULL and size
 * checks), writing results back, and {@link #guard}, which keeps exceptions from crossing the
 * boundary. The last failure's message is kept per thread for {@code last_error}.
 */
final class Marshal {
    private static final ThreadLocal<String> LAST_ERROR = ThreadLocal.withInitial(() -> "");
    /** Largest message kept for last_error (a huge one is cut, never refused). */
    private static final int MAX_ERROR_CHARS = 16 << 10;
    private static final AtomicLong NEXT_HANDLE = new AtomicLong(1);

    private Marshal() {}

    /** The environment variable holding this launch's join secret (set by {@code import pegaflow} when absent). */
    static final String JOIN_SECRET_ENV = "PEGAFLOW_JOIN_SECRET";

    /**
     * The join secret this process's server clients present (null when the host set none):
     * {@code $PEGAFLOW_JOIN_SECRET}, which the Python package draws once per launch and its
     * child processes (a vLLM instance's engine core and workers) inherit, so they act for the
     * instances any of them registered (RemoteStore, Identity). Read here, at the boundary
     * where the host hands its settings over, and nowhere else.
     */
    static byte[] joinSecret() {
        String s = System.getenv(JOIN_SECRET_ENV);
        if (s == null || s.isEmpty()) {
            return null;
        }
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        if (b.length < 16 || b.length > 64) {
            throw new InvalidArgumentException(JOIN_SECRET_ENV + " holds " + b.length + " bytes; expected 16..64 (a secret "
                    + "every process of one vLLM instance shares; unset it to have one drawn)");
        }
        return b;
    }

    @FunctionalInterface
    interface Body {
        void run() throws Exception;
    }

    /** Runs {@code body}; maps any throwable to an error code and keeps its message for this thread. */
    static int guard(Body body) {
        try {
            body.run();
            return 0;
        } catch (PegaflowException e) {
            setError(e.getMessage());
            return e.code().value();
        } catch (Throwable t) {
            setError(t.getClass().getName() + ": " + t.getMessage());
            return ErrorCode.INTERNAL.value();
        }
    }

    private static void setError(String message) {
        String m = String.valueOf(message);
        LAST_ERROR.set(m.length() > MAX_ERROR_CHARS ? m.substring(0, MAX_ERROR_CHARS) + "..." : m);
    }

    static String lastError() {
        return LAST_ERROR.get();
    }

    /** Objects behind {@code int64} handles, one kind per instance (engines, completions, brains, links). */
    static final class Handles<T> {
        private final Map<Long, T> map = new ConcurrentHashMap<>();
        private final String kind;

        Handles(String kind) {
            this.kind = kind;
        }

        long add(T value) {
            long h = NEXT_HANDLE.getAndIncrement();
            map.put(h, value);
            return h;
        }

        T get(long handle) {
            T v = map.get(handle);
            if (v == null) {
                throw new InvalidArgumentException(kind + " handle " + handle + " is unknown or closed");
            }
            return v;
        }

        /** Removes and returns it (null when unknown). */
        T remove(long handle) {
            return map.remove(handle);
        }

        /** Removes it; unknown is an error. */
        T take(long handle) {
            T v = map.remove(handle);
            if (v == null) {
                throw new InvalidArgumentException(kind + " handle " + handle + " is unknown or closed");
            }
            return v;
        }

        List<Long> handles() {
            return List.copyOf(map.keySet());
        }

        void clear() {
            map.clear();
        }
    }

    static String str(MemorySegment p, String what) {
        if (p.equals(MemorySegment.NULL)) {
            throw new InvalidArgumentException(what + " is NULL; expected a NUL-terminated UTF-8 string");
        }
        return p.reinterpret(Long.MAX_VALUE).getString(0, StandardCharsets.UTF_8);
    }

    static MemorySegment buffer(MemorySegment p, long bytes, String what) {
        if (p.equals(MemorySegment.NULL)) {
            throw new InvalidArgumentException(what + " is NULL; expected a buffer of " + bytes + " bytes");
        }
        return p.reinterpret(bytes);
    }

    /**
     * {@code n} int64 at {@code p}, {@code n} checked against {@code cap} (named {@code capName}
     * in the error) before anything is read or allocated: a bad count is an error, not a heap
     * of garbage or a read past the caller's array.
     */
    static long[] longs(MemorySegment p, int n, int cap, String capName, String what) {
        checkCount(n, cap, capName, what);
        return n == 0 ? new long[0] : buffer(p, 8L * n, what).toArray(JAVA_LONG);
    }

    /** Refuses a count below 0 or over {@code cap}; nothing is read. */
    static void checkCount(long n, long cap, String capName, String what) {
        if (n < 0 || n > cap) {
            throw new InvalidArgumentException(what + " count " + n + "; expected 0.." + cap + " (" + capName + ")");
        }
    }

    /** Block ids of one save or load: at most {@link Limits#MAX_HASHES_PER_CALL}. */
    static long[] blockIds(MemorySegment p, int n, String what) {
        return longs(p, n, Limits.MAX_HASHES_PER_CALL, "Limits.MAX_HASHES_PER_CALL", what);
    }

    static byte[] bytes(MemorySegment p, long len, String what) {
        if (len < 0) {
            throw new InvalidArgumentException(what + " length " + len + "; expected >= 0");
        }
        return len == 0 ? new byte[0] : buffer(p, len, what).toArray(JAVA_BYTE);
    }

    /** {@code n} hashes of {@code hashLen} bytes packed at {@code p}: one copy, kept packed. */
    static BlockHashes hashes(MemorySegment p, int n, int hashLen) {
        checkHashes(n, hashLen);
        return n == 0 ? BlockHashes.EMPTY : new BlockHashes(bytes(p, (long) n * hashLen, "hashes"), hashLen);
    }

    /** The count and length of {@link #hashes}, checked before anything is read or allocated. */
    static void checkHashes(int n, int hashLen) {
        if (n < 0 || (n > 0 && (hashLen < 1 || hashLen > 64))) {
            throw new InvalidArgumentException("hashes: count " + n + ", hash_len " + hashLen
                    + "; expected count >= 0 and 1 <= hash_len <= 64");
        }
        Limits.checkHashes((long) n * hashLen, hashLen);
    }

    /** '\n'-separated lines (NULL or "" for none). */
    static List<String> lines(MemorySegment p, String what) {
        if (p.equals(MemorySegment.NULL)) {
            return List.of();
        }
        String text = str(p, what);
        return text.isEmpty() ? List.of() : List.of(text.split("\n"));
    }

    /**
     * Writes {@code text} NUL-terminated into {@code buf} of {@code cap} bytes and its length
     * into {@code *outLen}; when it does not fit, only the length is written and the call fails
     * naming the size needed.
     */
    static void putText(byte[] text, MemorySegment buf, int cap, MemorySegment outLen, String what) {
        buffer(outLen, 4, "out_len").set(JAVA_INT, 0, text.length);
        if (cap <= text.length) {
            throw new InvalidArgumentException(what + " of " + text.length + " bytes does not fit " + cap
                    + " bytes; pass a buffer of at least " + (text.length + 1));
        }
        MemorySegment b = buffer(buf, cap, "buf");
        MemorySegment.copy(text, 0, b, JAVA_BYTE, 0, text.length);
        b.set(JAVA_BYTE, text.length, (byte) 0);
    }
}
