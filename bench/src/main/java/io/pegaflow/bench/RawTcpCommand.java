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

    @Override
    public Integer call() throws Exception {
        ByteBuffer buf = ByteBuffer.allocateDirect(4 << 20);
        if (listen != null) {
            try (ServerSocketChannel s = ServerSocketChannel.open()) {
                s.bind(Wire.hostPort(listen, "--listen"));
                System.out.println("ready");
                System.out.flush();
                for (int r = 0; r < rounds; r++) {
                    try (SocketChannel c = s.accept()) {
                        long got = 0;
                        int n;
                        while ((n = c.read(buf.clear())) > 0) {
                            got += n;
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
                while (sent < bytes) {
                    buf.clear().limit((int) Math.min(buf.capacity(), bytes - sent));
                    while (buf.hasRemaining()) {
                        sent += c.write(buf);
                    }
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
