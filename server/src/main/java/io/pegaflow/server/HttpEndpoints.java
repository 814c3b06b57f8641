package io.pegaflow.server;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.prometheus.metrics.config.EscapingScheme;
import io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.Executors;
import java.util.function.BooleanSupplier;
import java.util.function.Predicate;
import java.util.function.Supplier;
import java.util.stream.Collectors;

/**
 * {@code GET /health} (JSON; 200 only while serving, 503 otherwise), {@code GET /metrics}
 * (Prometheus text format), {@code GET /instances} (JSON) and the operator's {@code /admin/...}
 * calls ({@link AdminEndpoints}), on the JDK's HTTP server with its own threads, so a busy gRPC
 * side does not starve them.
 */
final class HttpEndpoints implements AutoCloseable {
    private final HttpServer http;

    HttpEndpoints(InetSocketAddress addr, PrometheusRegistry registry, BooleanSupplier serving,
            Supplier<String> healthJson, Supplier<List<String>> instances, Predicate<String> authorized, AdminEndpoints admin)
            throws IOException {
        http = HttpServer.create(addr, 64);
        http.setExecutor(Executors.newFixedThreadPool(2, r -> {
            Thread t = new Thread(r, "pegaflow-http");
            t.setDaemon(true);
            return t;
        }));
        PrometheusTextFormatWriter writer = PrometheusTextFormatWriter.create();
        http.createContext("/health", ex -> {
            boolean ok = serving.getAsBoolean();
            send(ex, ok ? 200 : 503, "application/json", healthJson.get());
        });
        http.createContext("/metrics", ex -> {
            ByteArrayOutputStream body = new ByteArrayOutputStream();
            writer.write(body, registry.scrape(), EscapingScheme.DEFAULT);
            send(ex, 200, PrometheusTextFormatWriter.CONTENT_TYPE, body.toString(StandardCharsets.UTF_8));
        });
        // Instance ids name tenants: shown to a caller with the server's token, hashed otherwise.
        http.createContext("/instances", ex -> {
            String auth = ex.getRequestHeaders().getFirst("Authorization");
            boolean shown = auth != null && authorized.test(auth);
            send(ex, 200, "application/json", "{\"ids\":\"" + (shown ? "plain" : "sha256") + "\",\"instances\":["
                    + instances.get().stream().map(id -> quote(shown ? id : sha256(id))).collect(Collectors.joining(","))
                    + "]}");
        });
        if (admin != null) {
            http.createContext("/admin/", admin::handle);
        }
        http.createContext("/", ex -> send(ex, 404, "text/plain", "not found; try /health, /metrics, /instances or /admin/status\n"));
        http.start();
    }

    int port() {
        return http.getAddress().getPort();
    }

    /** First 16 bytes of the id's SHA-256, hex: countable and comparable, not readable. */
    static String sha256(String id) {
        try {
            byte[] d = java.security.MessageDigest.getInstance("SHA-256").digest(id.getBytes(StandardCharsets.UTF_8));
            return java.util.HexFormat.of().formatHex(d, 0, 16);
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    static void send(HttpExchange ex, int code, String type, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", type);
        ex.sendResponseHeaders(code, bytes.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(bytes);
        }
    }

    @Override
    public void close() {
        http.stop(0);
    }
}
