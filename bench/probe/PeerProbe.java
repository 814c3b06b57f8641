import java.io.RandomAccessFile;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.zip.CRC32C;

/**
 * Where the peer fetch's time goes on one link: 128 MiB of 64 KiB blocks (4 slots of 16 KiB)
 * from a mapped /dev/shm file on one side into another on the other, sent and received the ways
 * the peer channel could. Run the receiver in one namespace, the sender in the other:
 * {@code java PeerProbe.java recv PORT MODE FILE} / {@code java PeerProbe.java send HOST:PORT MODE FILE}.
 * Sender modes: raw (4 MiB writes), gather (16 blocks per gathering write, CRC per block),
 * gather-nocrc, sendfile (CRCs of 16 blocks in one header write, then transferTo of the 1 MiB).
 * Receiver modes: raw, scatter (frames of 16 blocks, then CRC), scatter-nocrc, batch (header
 * then 1 MiB, the sendfile sender's framing, CRC per block).
 */
public final class PeerProbe {
    static final int SLOTS = Integer.parseInt(System.getenv().getOrDefault("SLOTS", "4"));
    static final int BLOCK = SLOTS * (16 << 10), SLOT = 16 << 10, BLOCKS = 2048, BATCH = 16, ROUNDS = 8;

    public static void main(String[] a) throws Exception {
        String mode = a[2];
        try (RandomAccessFile f = new RandomAccessFile(a[3], "rw"); Arena arena = Arena.ofShared()) {
            int regions = Integer.parseInt(System.getenv().getOrDefault("REGIONS", "1"));
            long region = (long) BLOCK * BLOCKS;
            f.setLength(region * regions);
            FileChannel fc = f.getChannel();
            MemorySegment whole = fc.map(FileChannel.MapMode.READ_WRITE, 0, region * regions, arena);
            for (long o = 0; o < whole.byteSize(); o += 4096) {
                whole.set(java.lang.foreign.ValueLayout.JAVA_BYTE, o, (byte) (o >> 12)); // resident
            }
            boolean reuse = System.getenv("REUSE") != null;
            long idleMs = Long.parseLong(System.getenv().getOrDefault("IDLE_MS", "0"));
            if (a[0].equals("recv")) {
                try (ServerSocketChannel s = ServerSocketChannel.open()) {
                    s.bind(new InetSocketAddress(Integer.parseInt(a[1])));
                    System.out.println("ready");
                    System.out.flush();
                    StringBuilder out = new StringBuilder();
                    SocketChannel c = null;
                    for (int r = 0; r < ROUNDS; r++) {
                        if (c == null || !reuse) {
                            c = s.accept();
                            c.socket().setTcpNoDelay(true);
                        }
                        c.read(ByteBuffer.allocate(1));
                        long t0 = System.nanoTime();
                        MemorySegment pool = whole.asSlice(region * (r % regions), region);
                        recv(c, mode, pool);
                        double gbps = (double) BLOCK * BLOCKS / (System.nanoTime() - t0);
                        out.append(String.format(" %.2f", gbps));
                        c.write(ByteBuffer.wrap(new byte[] {1}));
                        if (!reuse) {
                            c.close();
                        }
                    }
                    System.out.println(mode + " GB/s:" + out);
                }
            } else {
                String[] hp = a[1].split(":");
                SocketChannel c = null;
                for (int r = 0; r < ROUNDS; r++) {
                    if (c == null || !reuse) {
                        c = SocketChannel.open(new InetSocketAddress(hp[0], Integer.parseInt(hp[1])));
                        c.socket().setTcpNoDelay(true);
                    }
                    c.write(ByteBuffer.wrap(new byte[] {1}));
                    MemorySegment pool = whole.asSlice(region * (r % regions), region);
                    send(c, mode, pool, fc, region * (r % regions));
                    c.read(ByteBuffer.allocate(1));
                    if (!reuse) {
                        c.close();
                    }
                    Thread.sleep(idleMs);
                }
            }
        }
    }

    static void send(SocketChannel c, String mode, MemorySegment pool, FileChannel fc, long base) throws Exception {
        CRC32C crc = new CRC32C();
        switch (mode) {
            case "raw" -> {
                for (long o = 0; o < pool.byteSize(); o += 4 << 20) {
                    ByteBuffer b = pool.asSlice(o, Math.min(4 << 20, pool.byteSize() - o)).asByteBuffer();
                    while (b.hasRemaining()) c.write(b);
                }
            }
            case "gather", "gather-nocrc" -> {
                boolean check = mode.equals("gather");
                for (int i = 0; i < BLOCKS; i += BATCH) {
                    ByteBuffer[] fr = new ByteBuffer[BATCH * (SLOTS + 2)];
                    for (int k = 0; k < BATCH; k++) {
                        fr[(SLOTS + 2) * k] = ByteBuffer.allocate(18).putLong(i + k).putLong(BLOCK).putShort((short) 0).flip();
                        crc.reset();
                        for (int s = 0; s < SLOTS; s++) {
                            ByteBuffer slot = pool.asSlice((long) (i + k) * BLOCK + s * SLOT, SLOT).asByteBuffer();
                            if (check) crc.update(slot);
                            fr[(SLOTS + 2) * k + 1 + s] = slot.rewind();
                        }
                        fr[(SLOTS + 2) * k + SLOTS + 1] = ByteBuffer.allocate(4).putInt((int) crc.getValue()).flip();
                    }
                    ByteBuffer last = fr[fr.length - 1];
                    while (last.hasRemaining()) c.write(fr);
                }
            }
            case "sendfile", "sendfile-block", "sendfile-nocrc" -> {
                // one transferTo per batch of adjacent blocks, or ("-block") one per block
                boolean sums = !mode.equals("sendfile-nocrc");
                long step = mode.equals("sendfile-block") ? BLOCK : (long) BATCH * BLOCK;
                for (int i = 0; i < BLOCKS; i += BATCH) {
                    ByteBuffer head = ByteBuffer.allocateDirect(4 * BATCH);
                    for (int k = 0; k < BATCH; k++) {
                        crc.reset();
                        if (sums) {
                            crc.update(pool.asSlice((long) (i + k) * BLOCK, BLOCK).asByteBuffer());
                        }
                        head.putInt((int) crc.getValue());
                    }
                    head.flip();
                    while (head.hasRemaining()) c.write(head);
                    long end = base + (long) (i + BATCH) * BLOCK;
                    for (long at = base + (long) i * BLOCK; at < end; ) {
                        long stop = at + step;
                        while (at < stop) at += fc.transferTo(at, stop - at, c);
                    }
                }
            }
            default -> throw new IllegalArgumentException(mode);
        }
    }

    static void recv(SocketChannel c, String mode, MemorySegment pool) throws Exception {
        CRC32C crc = new CRC32C();
        long bad = 0;
        switch (mode) {
            case "raw" -> {
                for (long o = 0; o < pool.byteSize(); o += 4 << 20) {
                    ByteBuffer b = pool.asSlice(o, 4 << 20).asByteBuffer();
                    while (b.hasRemaining()) c.read(b);
                }
            }
            case "scatter", "scatter-nocrc" -> {
                boolean check = mode.equals("scatter");
                for (int i = 0; i < BLOCKS; i += BATCH) {
                    ByteBuffer[] fr = new ByteBuffer[BATCH * 3];
                    for (int k = 0; k < BATCH; k++) {
                        fr[3 * k] = ByteBuffer.allocate(18);
                        fr[3 * k + 1] = pool.asSlice((long) (i + k) * BLOCK, BLOCK).asByteBuffer();
                        fr[3 * k + 2] = ByteBuffer.allocate(4);
                    }
                    ByteBuffer last = fr[fr.length - 1];
                    while (last.hasRemaining()) c.read(fr);
                    if (check) {
                        for (int k = 0; k < BATCH; k++) {
                            crc.reset();
                            crc.update(fr[3 * k + 1].rewind());
                            bad += (int) crc.getValue() == fr[3 * k + 2].getInt(0) ? 0 : 1;
                        }
                    }
                }
            }
            case "batch", "batch-nocrc" -> {
                boolean check = mode.equals("batch");
                ByteBuffer head = ByteBuffer.allocate(4 * BATCH);
                for (int i = 0; i < BLOCKS; i += BATCH) {
                    ByteBuffer body = pool.asSlice((long) i * BLOCK, (long) BATCH * BLOCK).asByteBuffer();
                    head.clear();
                    ByteBuffer[] fr = {head, body};
                    while (body.hasRemaining()) c.read(fr);
                    if (check) {
                        for (int k = 0; k < BATCH; k++) {
                            crc.reset();
                            crc.update(body.slice(k * BLOCK, BLOCK));
                            bad += (int) crc.getValue() == head.getInt(4 * k) ? 0 : 1;
                        }
                    }
                }
            }
            default -> throw new IllegalArgumentException(mode);
        }
        if (bad > 0) System.out.println("bad blocks: " + bad);
    }
}
