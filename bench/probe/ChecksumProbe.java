import java.nio.ByteBuffer;
import java.util.zip.Adler32;
import java.util.zip.CRC32;
import java.util.zip.CRC32C;
import java.util.zip.Checksum;

/**
 * How fast the JDK's checksums run on this machine, over direct memory in 256 KiB pieces: cold
 * (256 MiB, from memory) and cached (one 256 KiB piece again and again), best of several rounds.
 * Behind the peer wire's choice of CRC32 (docs/cluster.md): {@code java bench/probe/ChecksumProbe.java}.
 */
public final class ChecksumProbe {
    public static void main(String[] args) {
        for (String name : new String[] {"crc32c", "crc32", "adler32"}) {
            System.out.printf("%s: cold %.2f GB/s, cached %.2f GB/s%n", name, gbps(name, 256 << 20, 8), gbps(name, 256 << 10, 20_000));
        }
    }

    private static double gbps(String name, int total, int rounds) {
        ByteBuffer buf = ByteBuffer.allocateDirect(total);
        for (int i = 0; i < total; i += 8) {
            buf.putLong(i, i * 0x9E3779B97F4A7C15L);
        }
        Checksum c = switch (name) {
            case "crc32c" -> new CRC32C();
            case "crc32" -> new CRC32();
            default -> new Adler32();
        };
        int piece = 256 << 10;
        long best = Long.MAX_VALUE;
        for (int r = 0; r < rounds + 3; r++) {
            long t0 = System.nanoTime();
            for (int at = 0; at < total; at += piece) {
                c.reset();
                c.update(buf.clear().position(at).limit(at + piece));
            }
            best = Math.min(best, System.nanoTime() - t0);
        }
        return total / (double) best;
    }
}
