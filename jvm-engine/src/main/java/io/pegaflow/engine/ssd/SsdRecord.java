package io.pegaflow.engine.ssd;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.zip.CRC32C;

/**
 * The on-disk format: a shard file starts with one {@link #PAGE}-byte file header, then holds
 * records. A record is one header page and the block's slots concatenated in slot order,
 * padded to a page. Every integer is little-endian.
 *
 * <pre>
 * file header: magic "PFSSDSHD" | u32 version | u32 shard | u64 capacity | ... | u32 crc32c(bytes 0..4091) at 4092
 * record header: magic "PFSSDREC" | u32 version | u32 used | u64 seq | u64 payload bytes
 *                | u32 payload crc32c | u16 namespace bytes | u16 hash bytes | u32 slots | u32 runs
 *                | namespace | hash | runs x (u32 count, u64 slot bytes) | ... | u32 crc32c(bytes 0..4091) at 4092
 * </pre>
 * The slot geometry (run-length encoded slot sizes) is checked against the namespace's
 * layout before a record is read into the pool; the payload checksum before its bytes are
 * used. A header that fails its own checksum is not a record (torn, overwritten or foreign).
 */
public final class SsdRecord {
    public static final int PAGE = 4096;
    public static final int VERSION = 1;
    static final long FILE_MAGIC = magic("PFSSDSHD");
    static final long RECORD_MAGIC = magic("PFSSDREC");
    private static final ValueLayout.OfInt INT = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfLong LONG = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfShort SHORT = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final int CRC_AT = PAGE - 4;
    private static final int FIXED = 48;

    private SsdRecord() {}

    /** What a record header says. {@code runs}: pairs (count, slot bytes) flattened. */
    public record Header(long seq, long payloadBytes, int payloadCrc, String namespace, byte[] hash, int slots,
            long[] runs) {
        public long recordBytes() {
            return SsdRecord.recordBytes(payloadBytes);
        }
    }

    /** Bytes a header needs; more than a page means the block is not stored on SSD. */
    static int headerBytes(String namespace, byte[] hash, long[] runs) {
        return FIXED + namespace.getBytes(StandardCharsets.UTF_8).length + hash.length + runs.length / 2 * 12 + 4;
    }

    static boolean fits(String namespace, byte[] hash, long[] runs) {
        return headerBytes(namespace, hash, runs) <= CRC_AT; // so the u16 lengths hold too
    }

    static void writeHeader(MemorySegment page, Header h) {
        page.asSlice(0, PAGE).fill((byte) 0);
        byte[] ns = h.namespace().getBytes(StandardCharsets.UTF_8);
        page.set(LONG, 0, RECORD_MAGIC);
        page.set(INT, 8, VERSION);
        page.set(INT, 12, headerBytes(h.namespace(), h.hash(), h.runs()));
        page.set(LONG, 16, h.seq());
        page.set(LONG, 24, h.payloadBytes());
        page.set(INT, 32, h.payloadCrc());
        page.set(SHORT, 36, (short) ns.length);
        page.set(SHORT, 38, (short) h.hash().length);
        page.set(INT, 40, h.slots());
        page.set(INT, 44, h.runs().length / 2);
        long at = FIXED;
        MemorySegment.copy(ns, 0, page, ValueLayout.JAVA_BYTE, at, ns.length);
        at += ns.length;
        MemorySegment.copy(h.hash(), 0, page, ValueLayout.JAVA_BYTE, at, h.hash().length);
        at += h.hash().length;
        for (int i = 0; i < h.runs().length; i += 2) {
            page.set(INT, at, (int) h.runs()[i]);
            page.set(LONG, at + 4, h.runs()[i + 1]);
            at += 12;
        }
        page.set(INT, CRC_AT, crc(page, 0, CRC_AT));
    }

    /** Why a page is not a record header we can read, or null when it is one. */
    static String problem(MemorySegment page) {
        long magic = page.get(LONG, 0);
        if (magic != RECORD_MAGIC) {
            return "no record magic";
        }
        if (page.get(INT, CRC_AT) != crc(page, 0, CRC_AT)) {
            return "header checksum mismatch";
        }
        int version = page.get(INT, 8);
        if (version != VERSION) {
            return "record format version " + version + " (this build reads " + VERSION + ")";
        }
        return null;
    }

    /** Decodes a page {@link #problem} accepted. */
    static Header readHeader(MemorySegment page) {
        int nsLen = Short.toUnsignedInt(page.get(SHORT, 36));
        int hashLen = Short.toUnsignedInt(page.get(SHORT, 38));
        int slots = page.get(INT, 40);
        int runCount = page.get(INT, 44);
        if (FIXED + nsLen + hashLen + (long) runCount * 12 > CRC_AT || runCount < 0) {
            throw new IllegalStateException("record header lengths out of range");
        }
        long at = FIXED;
        byte[] ns = page.asSlice(at, nsLen).toArray(ValueLayout.JAVA_BYTE);
        at += nsLen;
        byte[] hash = page.asSlice(at, hashLen).toArray(ValueLayout.JAVA_BYTE);
        at += hashLen;
        long[] runs = new long[runCount * 2];
        for (int i = 0; i < runCount; i++) {
            runs[2 * i] = page.get(INT, at);
            runs[2 * i + 1] = page.get(LONG, at + 4);
            at += 12;
        }
        return new Header(page.get(LONG, 16), page.get(LONG, 24), page.get(INT, 32),
                new String(ns, StandardCharsets.UTF_8), hash, slots, runs);
    }

    static void writeFileHeader(MemorySegment page, int shard, long capacity) {
        page.asSlice(0, PAGE).fill((byte) 0);
        page.set(LONG, 0, FILE_MAGIC);
        page.set(INT, 8, VERSION);
        page.set(INT, 12, shard);
        page.set(LONG, 16, capacity);
        page.set(INT, CRC_AT, crc(page, 0, CRC_AT));
    }

    /** Why a file's first page is not our shard header, or null. */
    static String fileProblem(MemorySegment page) {
        if (page.get(LONG, 0) != FILE_MAGIC) {
            return "not a PegaFlow SSD shard (no shard magic)";
        }
        if (page.get(INT, CRC_AT) != crc(page, 0, CRC_AT)) {
            return "shard header checksum mismatch";
        }
        int version = page.get(INT, 8);
        if (version != VERSION) {
            return "shard format version " + version + "; this build reads version " + VERSION;
        }
        return null;
    }

    /** Slot sizes as runs of equal sizes, flattened (count, bytes, count, bytes, ...). */
    public static long[] runs(long[] slotBytes) {
        long[] out = new long[8];
        int n = 0;
        for (int i = 0; i < slotBytes.length; ) {
            int j = i;
            while (j < slotBytes.length && slotBytes[j] == slotBytes[i]) {
                j++;
            }
            if (n + 2 > out.length) {
                out = Arrays.copyOf(out, out.length * 2);
            }
            out[n++] = j - i;
            out[n++] = slotBytes[i];
            i = j;
        }
        return Arrays.copyOf(out, n);
    }

    /** Disk bytes of a record holding {@code payloadBytes}: its header page and the payload padded to a page. */
    public static long recordBytes(long payloadBytes) {
        return PAGE + roundUp(payloadBytes);
    }

    public static long roundUp(long bytes) {
        return (bytes + PAGE - 1) / PAGE * PAGE;
    }

    static int crc(MemorySegment s, long offset, long length) {
        CRC32C c = new CRC32C();
        c.update(s.asSlice(offset, length).asByteBuffer());
        return (int) c.getValue();
    }

    private static long magic(String s) {
        byte[] b = s.getBytes(StandardCharsets.US_ASCII);
        long v = 0;
        for (int i = 7; i >= 0; i--) {
            v = v << 8 | (b[i] & 0xff);
        }
        return v;
    }
}
