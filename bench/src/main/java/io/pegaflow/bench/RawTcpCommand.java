package io.pegaflow.bench;

import io.pegaflow.client.Wire;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.Locale;
import java.util.concurrent.Callable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * {@code pegaflow-bench raw-tcp}: the baseline of {@code pegaflow-bench cluster}: bytes from
 * one direct buffer to another over one TCP connection, as the peer channel moves them
 * (SocketChannel, no TLS). {@code --listen} receives; {@code --connect} sends and prints GB/s.
 */
@Command(name = "raw-tcp", mixinStandardHelpOptions = true, description = "raw TCP throughput between two hosts (JSON line)")
public final class RawTcpCommand implements Callable<Integer> {
    @Option(names = "--listen", description = "HOST:PORT to receive on (one connection per round)")
    String listen;

    @Option(names = "--connect", description = "HOST:PORT to send to")
    String connect;

    @Option(names = "--bytes", defaultValue = "1073741824", description = "bytes per round (default ${DEFAULT-VALUE})")
    long bytes;

    @Option(names = "--rounds", defaultValue = "3")
    int rounds;

    @Option(names = "--buffer-bytes", defaultValue = "4194304",
            description = "memory each side cycles through (default 4 MiB: stays in cache; the size of a fetch moves memory as a fetch does)")
    long bufferBytes;

    @Override
    public Integer call() throws Exception {
        if (bufferBytes < 4096 || bufferBytes > (1L << 31) - 4096) {
            throw new IllegalArgumentException("--buffer-bytes " + bufferBytes + "; expected 4096 .. 2 GiB");
        }
        ByteBuffer buf = ByteBuffer.allocateDirect((int) bufferBytes); // zeroed: every page touched before timing
        int chunk = 4 << 20;
        if (listen != null) {
            try (ServerSocketChannel s = ServerSocketChannel.open()) {
                s.bind(Wire.hostPort(listen, "--listen"));
                System.out.println("ready");
                System.out.flush();
                for (int r = 0; r < rounds; r++) {
                    try (SocketChannel c = s.accept()) {
                        long got = 0;
                        int n;
                        int at = 0;
                        while ((n = c.read(buf.limit(Math.min(buf.capacity(), at + chunk)).position(at))) > 0) {
                            got += n;
                            at = buf.position() == buf.capacity() ? 0 : buf.position();
                        }
                        c.write(ByteBuffer.wrap(new byte[] {1}));
                    }
                }
            }
            return 0;
        }
        double best = 0;
        StringBuilder all = new StringBuilder();
        for (int r = 0; r < rounds; r++) {
            try (SocketChannel c = SocketChannel.open(Wire.hostPort(connect, "--connect"))) {
                c.socket().setTcpNoDelay(true);
                long t0 = System.nanoTime();
                long sent = 0;
                int at = 0;
                while (sent < bytes) {
                    int n = (int) Math.min(Math.min(chunk, buf.capacity() - at), bytes - sent);
                    buf.limit(at + n).position(at);
                    while (buf.hasRemaining()) {
                        sent += c.write(buf);
                    }
                    at = at + n == buf.capacity() ? 0 : at + n;
                }
                c.shutdownOutput();
                c.read(ByteBuffer.allocate(1));
                double gbps = bytes / ((System.nanoTime() - t0) / 1e9) / 1e9;
                all.append(r == 0 ? "" : ",").append(String.format(Locale.ROOT, "%.3f", gbps));
                best = Math.max(best, gbps);
            }
        }
        System.out.println("{\"raw_tcp_gbps_rounds\":[" + all + "]}");
        return 0;
    }
}
