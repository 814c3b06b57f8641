package io.pegaflow.server;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import com.google.gson.Strictness;
import com.google.gson.stream.JsonReader;
import com.google.gson.stream.JsonToken;
import com.sun.net.httpserver.HttpExchange;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineClosedException;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.QuotaExceededException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.metrics.Gauge;
import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.IOException;
import java.io.InputStream;
import java.io.StringReader;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.List;
import java.util.Set;

/**
 * The operator's HTTP calls, {@code /admin/...} on the server's HTTP port: status, clear a
 * namespace or all, drop an instance, pin, unpin and warm a prefix (docs/server.md, "Admin
 * API"). Each needs the operator token ({@code Authorization: Bearer}; 401 without it, 403
 * with the tenants' token). Bodies are JSON objects of at most {@link #MAX_BODY_BYTES}, refused
 * by their Content-Length before a byte is read (413); a malformed body or field is a 400 that
 * names the field and what was expected, an unknown namespace or instance a 404. Every call is
 * counted in {@code pegaflow_admin_requests_total{op,status}}. Runs on the HTTP server's threads.
 */
final class AdminEndpoints {
    private static final System.Logger LOG = System.getLogger(AdminEndpoints.class.getName());

    /** The largest request body read; a larger one is answered 413. */
    static final int MAX_BODY_BYTES = 1 << 20;

    private enum Op {
        STATUS("GET"), CLEAR("POST"), DROP_INSTANCE("POST"), PIN("POST"), UNPIN("POST"), WARM("POST"), EVENTS("GET");

        final String method;
        final String path;

        Op(String method) {
            this.method = method;
            this.path = "/admin/" + name().toLowerCase().replace('_', '-');
        }

        static Op of(String path) {
            for (Op op : values()) {
                if (op.path.equals(path)) {
                    return op;
                }
            }
            return null;
        }
    }

    /** A refusal: the HTTP status and the message sent back as {@code {"error": ...}}. */
    private static final class Refused extends RuntimeException {
        final int status;

        Refused(int status, String message) {
            super(message, null, false, false);
            this.status = status;
        }
    }

    private final LocalStore store;
    private final Tenants tenants;
    private final Credentials credentials;
    private final Rejections rejections;
    final Counter requests;

    AdminEndpoints(LocalStore store, Tenants tenants, Credentials credentials, Rejections rejections, PrometheusRegistry registry) {
        this.store = store;
        this.tenants = tenants;
        this.credentials = credentials;
        this.rejections = rejections;
        this.requests = Counter.builder().name("pegaflow_admin_requests")
                .help("operator's /admin HTTP calls by operation and HTTP status").labelNames("op", "status").withoutExemplars()
                .register(registry);
    }

    /** Answers one exchange under {@code /admin/}. */
    void handle(HttpExchange ex) throws IOException {
        String path = ex.getRequestURI().getPath();
        Op op = Op.of(path);
        int status;
        String body;
        try {
            JsonObject reply = serve(op, path, ex);
            status = 200;
            body = reply.toString();
        } catch (Refused r) {
            status = r.status;
            JsonObject e = new JsonObject();
            e.addProperty("error", r.getMessage());
            body = e.toString();
            if (status == 401) {
                ex.getResponseHeaders().set("WWW-Authenticate", "Bearer realm=\"pegaflow-admin\"");
            } else if (status == 405) {
                ex.getResponseHeaders().set("Allow", op.method);
            }
        }
        requests.labelValues(op == null ? "unknown" : op.path.substring("/admin/".length()), Integer.toString(status)).inc();
        HttpEndpoints.send(ex, status, "application/json", body + "\n");
    }

    private JsonObject serve(Op op, String path, HttpExchange ex) throws IOException {
        switch (credentials.holder(ex.getRequestHeaders().getFirst("Authorization"))) {
            case OPERATOR -> {}
            case TENANT -> {
                rejections.record(Rejections.Reason.OPERATOR_ONLY, "HTTP " + (op == null ? "/admin/?" : op.path));
                throw new Refused(403, "the admin API is the operator's: it needs the operator token ("
                        + credentials.operatorTokenFile() + ", the server's user only; --operator-token-file), not the tenants' token");
            }
            case NOBODY -> {
                rejections.record(Rejections.Reason.UNAUTHENTICATED, "HTTP " + (op == null ? "/admin/?" : op.path));
                throw new Refused(401, "the admin API needs 'Authorization: Bearer <operator token>' (the token in "
                        + credentials.operatorTokenFile() + ", or --operator-token-file)");
            }
        }
        if (op == null) {
            throw new Refused(404, "no admin call " + Limits.quote(path) + "; expected one of " + List.of(Op.values()).stream()
                    .map(o -> o.method + " " + o.path).toList());
        }
        if (!op.method.equals(ex.getRequestMethod())) {
            throw new Refused(405, op.path + " takes " + op.method + ", not " + Limits.quote(ex.getRequestMethod()));
        }
        JsonObject in = op.method.equals("GET") ? null : body(ex);
        try {
            return switch (op) {
                case STATUS -> status();
                case CLEAR -> clear(in);
                case DROP_INSTANCE -> dropInstance(in);
                case PIN -> pin(in);
                case UNPIN -> unpin(in);
                case WARM -> warm(in);
                case EVENTS -> events(ex.getRequestURI().getRawQuery());
            };
        } catch (Refused r) {
            throw r;
        } catch (InvalidArgumentException bad) {
            throw new Refused(400, bad.getMessage());
        } catch (QuotaExceededException full) {
            throw new Refused(409, full.getMessage());
        } catch (UnknownInstanceException gone) {
            throw new Refused(404, gone.getMessage());
        } catch (EngineClosedException closed) {
            throw new Refused(503, "the server is stopping");
        } catch (RuntimeException bug) {
            LOG.log(System.Logger.Level.ERROR, "admin call " + op.path + " failed", bug);
            throw new Refused(500, op.path + " failed: " + bug + " (logged)");
        }
    }

    // ---------------------------------------------------------------- the calls

    private JsonObject status() {
        EngineStats s = store.stats();
        JsonObject out = new JsonObject();
        out.add("pool", object("capacity_bytes", s.get(Gauge.POOL_CAPACITY_BYTES), "used_bytes", s.get(Gauge.POOL_USED_BYTES)));
        out.add("resident", object("blocks", s.get(Gauge.RESIDENT_BLOCKS), "bytes", s.get(Gauge.RESIDENT_BYTES)));
        JsonObject pinned = object("blocks", s.get(Gauge.ADMIN_PINNED_BLOCKS), "bytes", s.get(Gauge.ADMIN_PINNED_BYTES));
        pinned.addProperty("max_bytes", store.maxPinnedBytes());
        out.add("pinned", pinned);
        out.addProperty("active_leases", s.get(Gauge.ACTIVE_LEASES));
        JsonArray ids = new JsonArray();
        store.instanceIds().forEach(ids::add);
        out.add("instances", ids);
        JsonArray namespaces = new JsonArray();
        for (LocalStore.NamespaceSummary n : store.namespaces()) {
            JsonObject o = new JsonObject();
            o.addProperty("namespace", n.namespace());
            o.addProperty("blocks", n.blocks());
            o.addProperty("pinned_blocks", n.pinnedBlocks());
            o.addProperty("pinned_bytes", n.pinnedBytes());
            namespaces.add(o);
        }
        out.add("namespaces", namespaces);
        out.add("ssd", store.ssd() == null ? null : object("blocks", s.get(Gauge.SSD_BLOCKS), "bytes", s.get(Gauge.SSD_BYTES)));
        return out;
    }

    /**
     * {@code GET /admin/events?after=SEQ&max=N}: the store's block events after {@code SEQ} (0:
     * from the oldest kept), at most N (default 1,000, at most {@link io.pegaflow.engine.store.KvEventLog#MAX_READ}),
     * every namespace on the host; {@code next} is the {@code after} of the following call and
     * {@code gap} says that events were dropped before this reader came for them.
     */
    private JsonObject events(String rawQuery) {
        long after = 0;
        int max = 1000;
        if (rawQuery != null && !rawQuery.isEmpty()) {
            if (rawQuery.length() > 256) {
                throw new Refused(400, "query of " + rawQuery.length() + " characters; expected after=SEQ&max=N");
            }
            for (String pair : rawQuery.split("&")) {
                int eq = pair.indexOf('=');
                String key = eq < 0 ? pair : pair.substring(0, eq);
                String value = eq < 0 ? "" : pair.substring(eq + 1);
                try {
                    switch (key) {
                        case "after" -> after = Long.parseLong(value);
                        case "max" -> max = Integer.parseInt(value);
                        default -> throw new Refused(400, "query parameter " + Limits.quote(key) + "; expected after or max");
                    }
                } catch (NumberFormatException e) {
                    throw new Refused(400, "query parameter '" + key + "' is " + Limits.quote(value) + "; expected an integer");
                }
            }
        }
        io.pegaflow.engine.store.KvEventLog.Batch b = store.events().after(after, max);
        JsonArray list = new JsonArray();
        HexFormat hex = HexFormat.of();
        for (io.pegaflow.engine.store.KvEventLog.Event e : b.events()) {
            JsonObject o = new JsonObject();
            o.addProperty("seq", e.seq());
            o.addProperty("type", e.kind().vllmName);
            o.addProperty("medium", e.tier());
            o.addProperty("namespace", e.namespace());
            o.addProperty("block_hash", hex.formatHex(e.hash()));
            o.addProperty("ts_ms", e.epochMillis());
            list.add(o);
        }
        JsonObject out = new JsonObject();
        out.addProperty("next", b.next());
        out.addProperty("gap", b.gap());
        out.add("events", list);
        return out;
    }

    private JsonObject clear(JsonObject in) {
        onlyFields(in, "namespace", "all", "dram", "ssd");
        String namespace = string(in, "namespace", false);
        boolean all = bool(in, "all", false);
        if ((namespace == null) == !all) {
            throw new Refused(400, "fields 'namespace' and 'all': expected exactly one, {\"namespace\": \"...\"} or {\"all\": true}");
        }
        boolean dram = bool(in, "dram", true);
        boolean ssd = bool(in, "ssd", true);
        if (!dram && !ssd) {
            throw new Refused(400, "fields 'dram' and 'ssd': both false; expected at least one tier to clear");
        }
        LocalStore.Cleared c = store.clear(namespace, dram, ssd);
        if (c == null) {
            throw unknownNamespace(namespace, " and the SSD tier holds none of its blocks");
        }
        JsonObject out = new JsonObject();
        out.addProperty("namespace", namespace);
        out.addProperty("dram_blocks", c.blocks());
        out.addProperty("dram_bytes", c.bytes());
        out.addProperty("referenced_blocks", c.referenced());
        out.addProperty("unpinned_blocks", c.unpinned());
        out.addProperty("ssd_records", c.ssdRecords());
        return out;
    }

    private JsonObject dropInstance(JsonObject in) {
        onlyFields(in, "instance_id");
        String id = EngineService.instanceId(string(in, "instance_id", true));
        tenants.unregister(id, () -> store.unregisterInstance(id)); // as UnregisterInstance: leases released, members gone
        JsonObject out = new JsonObject();
        out.addProperty("instance_id", id);
        out.addProperty("dropped", true);
        return out;
    }

    private JsonObject pin(JsonObject in) {
        String namespace = prefixCall(in);
        LocalStore.Pinned p = store.pin(namespace, hashes(in));
        if (p == null) {
            throw unknownNamespace(namespace);
        }
        EngineStats s = store.stats();
        JsonObject out = object("pinned", p.pinned(), "already_pinned", p.alreadyPinned());
        out.addProperty("not_resident", p.notResident());
        out.addProperty("pinned_blocks", s.get(Gauge.ADMIN_PINNED_BLOCKS));
        out.addProperty("pinned_bytes", s.get(Gauge.ADMIN_PINNED_BYTES));
        return out;
    }

    private JsonObject unpin(JsonObject in) {
        String namespace = prefixCall(in);
        int n = store.unpin(namespace, hashes(in));
        if (n < 0) {
            throw unknownNamespace(namespace);
        }
        return object("unpinned", n, "pinned_blocks", store.stats().get(Gauge.ADMIN_PINNED_BLOCKS));
    }

    private JsonObject warm(JsonObject in) {
        String namespace = prefixCall(in);
        BlockHashes hashes = hashes(in);
        if (store.ssd() == null) {
            throw new Refused(409, "warm: this server has no SSD tier to read from (start it with --ssd-cache-path)");
        }
        LocalStore.Warming w = store.warm(namespace, hashes);
        if (w == null) {
            throw unknownNamespace(namespace);
        }
        return object("resident", w.resident(), "reading", w.reading());
    }

    /** Pin, unpin and warm: {@code {"namespace": "...", "hashes": ["<hex>", ...]}}; the namespace. */
    private static String prefixCall(JsonObject in) {
        onlyFields(in, "namespace", "hashes");
        return string(in, "namespace", true);
    }

    private static Refused unknownNamespace(String namespace) {
        return unknownNamespace(namespace, "");
    }

    private static Refused unknownNamespace(String namespace, String more) {
        return new Refused(404, "namespace '" + Limits.quote(namespace) + "' is unknown: no instance of it registered since the"
                + " server started" + more + " (GET /admin/status lists the namespaces)");
    }

    // ---------------------------------------------------------------- the body and its fields

    /** The request's body as one JSON object: 413 past {@link #MAX_BODY_BYTES}, 400 if it is not UTF-8 JSON. */
    private static JsonObject body(HttpExchange ex) throws IOException {
        String length = ex.getRequestHeaders().getFirst("Content-Length");
        if (length != null) {
            long n;
            try {
                n = Long.parseLong(length.trim());
            } catch (NumberFormatException e) {
                throw new Refused(400, "header 'Content-Length': '" + Limits.quote(length) + "'; expected a number of bytes");
            }
            if (n > MAX_BODY_BYTES) {
                throw new Refused(413, "body of " + n + " bytes; expected at most " + MAX_BODY_BYTES
                        + " (AdminEndpoints.MAX_BODY_BYTES): send fewer hashes per call");
            }
        }
        byte[] raw;
        try (InputStream body = ex.getRequestBody()) {
            raw = body.readNBytes(MAX_BODY_BYTES + 1); // a chunked body has no Content-Length
        }
        if (raw.length > MAX_BODY_BYTES) {
            throw new Refused(413, "body over " + MAX_BODY_BYTES + " bytes; expected at most that (AdminEndpoints.MAX_BODY_BYTES)");
        }
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(raw)).toString();
        } catch (CharacterCodingException e) {
            throw new Refused(400, "body is not UTF-8 (" + e.getMessage() + "); expected a JSON object");
        }
        JsonElement e;
        try {
            JsonReader r = new JsonReader(new StringReader(text));
            r.setStrictness(Strictness.STRICT);
            e = JsonParser.parseReader(r);
            if (r.peek() != JsonToken.END_DOCUMENT) { // strict readers refuse a second value already; kept as a guard
                throw new Refused(400, "body has more after its first JSON value; expected one JSON object");
            }
        } catch (JsonParseException | IOException | IllegalStateException bad) {
            throw new Refused(400, "body is not JSON: " + jsonError(bad) + "; expected one JSON object");
        }
        if (!e.isJsonObject()) {
            throw new Refused(400, "body is " + (e.isJsonNull() ? "empty" : Limits.quote(e.toString()))
                    + "; expected a JSON object such as {\"namespace\": \"...\"}");
        }
        return e.getAsJsonObject();
    }

    /** Gson's reason, where it is ("... at line 1 column 16 path $"), without its advice to parse leniently. */
    private static String jsonError(Exception e) {
        Throwable t = e.getCause() != null && e.getMessage() != null && e.getMessage().startsWith(e.getCause().getClass().getName())
                ? e.getCause() : e;
        String m = String.valueOf(t.getMessage());
        int see = m.indexOf("\nSee ");
        m = (see >= 0 ? m.substring(0, see) : m).replace("Use JsonReader.setStrictness(Strictness.LENIENT) to accept malformed JSON",
                "malformed JSON");
        return m.length() > 200 ? m.substring(0, 200) + "..." : m;
    }

    private static void onlyFields(JsonObject in, String... allowed) {
        Set<String> ok = Set.of(allowed);
        for (String key : in.keySet()) {
            if (!ok.contains(key)) {
                throw new Refused(400, "unknown field '" + Limits.quote(key) + "'; expected only " + String.join(", ", allowed));
            }
        }
    }

    /** A string field, checked as names are (printable, at most Limits.MAX_NAME_BYTES); null when absent and not required. */
    private static String string(JsonObject in, String field, boolean required) {
        JsonElement e = in.get(field);
        if (e == null) {
            if (required) {
                throw new Refused(400, "field '" + field + "' is missing; expected a string");
            }
            return null;
        }
        if (!(e instanceof JsonPrimitive p) || !p.isString()) {
            throw new Refused(400, "field '" + field + "' is " + Limits.quote(e.toString()) + "; expected a string");
        }
        String s = p.getAsString();
        if (s.isEmpty()) {
            throw new Refused(400, "field '" + field + "' is empty; expected a non-empty string");
        }
        Limits.checkName("field '" + field + "'", s);
        Limits.checkPrintable("field '" + field + "'", s);
        return s;
    }

    private static boolean bool(JsonObject in, String field, boolean absent) {
        JsonElement e = in.get(field);
        if (e == null) {
            return absent;
        }
        if (!(e instanceof JsonPrimitive p) || !p.isBoolean()) {
            throw new Refused(400, "field '" + field + "' is " + Limits.quote(e.toString()) + "; expected true or false");
        }
        return p.getAsBoolean();
    }

    /** Field 'hashes': a non-empty array of hex strings of one length, packed into one array as they are read. */
    private static BlockHashes hashes(JsonObject in) {
        JsonElement e = in.get("hashes");
        if (e == null || !e.isJsonArray() || e.getAsJsonArray().isEmpty()) {
            throw new Refused(400, "field 'hashes' is " + (e == null ? "missing" : Limits.quote(e.toString()))
                    + "; expected a non-empty array of block hashes in hex, such as [\"9f86d081...\"]");
        }
        JsonArray a = e.getAsJsonArray();
        Limits.checkCount("field 'hashes'", a.size(), Limits.MAX_HASHES_PER_CALL, "MAX_HASHES_PER_CALL");
        int hashLen = -1;
        byte[] packed = null;
        HexFormat hex = HexFormat.of();
        for (int i = 0; i < a.size(); i++) {
            JsonElement h = a.get(i);
            String s = h instanceof JsonPrimitive p && p.isString() ? p.getAsString() : null;
            int len = s == null || s.length() % 2 != 0 ? -1 : s.length() / 2;
            if (len < 1 || len > Limits.MAX_HASH_BYTES) {
                throw new Refused(400, "field 'hashes'[" + i + "] is " + Limits.quote(h.toString()) + "; expected a string of 2.."
                        + 2 * Limits.MAX_HASH_BYTES + " hex digits, an even number");
            }
            if (hashLen < 0) {
                hashLen = len;
                packed = new byte[a.size() * len];
            } else if (len != hashLen) {
                throw new Refused(400, "field 'hashes'[" + i + "] is " + len + " bytes but hashes[0] is " + hashLen
                        + "; expected one length per call");
            }
            try {
                for (int k = 0; k < len; k++) {
                    packed[i * len + k] = (byte) hex.fromHexDigits(s, 2 * k, 2 * k + 2);
                }
            } catch (IllegalArgumentException bad) { // NumberFormatException: not a hex digit
                throw new Refused(400, "field 'hashes'[" + i + "] is " + Limits.quote(h.toString()) + "; expected hex digits only");
            }
        }
        return new BlockHashes(packed, hashLen);
    }

    private static JsonObject object(String k1, long v1, String k2, long v2) {
        JsonObject o = new JsonObject();
        o.addProperty(k1, v1);
        o.addProperty(k2, v2);
        return o;
    }
}
