package io.pegaflow.connector;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Token;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;

/**
 * One engine step's plan, from the scheduler-side connector to every worker (it travels
 * inside vLLM's pickled {@code KVConnectorMetadata} as an opaque byte string): the loads to
 * start (lease and destination block ids), the saves to submit (block ids and their vLLM
 * hashes), and the requests preempted this step (their in-flight saves must finish before
 * their blocks are reused).
 */
public record StepPlan(List<Load> loads, List<Save> saves, List<String> preempted) {
    private static final int VERSION = 4;

    /**
     * Load the leased blocks into {@code blockIds} (one per leased block, in order) of KV-cache
     * group {@code group} (0 for a model with one group). {@code inStep}: vLLM runs the request
     * in this very step (it was told the tokens are ready), so the copy goes layer by layer and
     * each attention layer waits for its own layer; otherwise the load is asynchronous and
     * reported through get_finished.
     */
    public record Load(String requestId, int group, Token lease, long[] blockIds, boolean inStep) {
        public Load(String requestId, int group, Token lease, long[] blockIds) {
            this(requestId, group, lease, blockIds, false);
        }
    }

    /** Save {@code blockIds[i]} of KV-cache group {@code group} under hash {@code i} (all of this worker's layers of it). */
    public record Save(String requestId, int group, long[] blockIds, BlockHashes hashes) {}

    /** The bytes of a plan with nothing in it: none at all ({@link #decode} reads them as that plan). */
    public static final byte[] EMPTY_BYTES = new byte[0];

    public boolean isEmpty() {
        return loads.isEmpty() && saves.isEmpty() && preempted.isEmpty();
    }

    public byte[] encode() {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        try (DataOutputStream out = new DataOutputStream(bytes)) {
            // header: version, then the three section counts
            out.writeInt(VERSION);
            out.writeInt(loads.size());
            out.writeInt(saves.size());
            out.writeInt(preempted.size());
            for (Load l : loads) {
                out.writeUTF(l.requestId());
                out.writeInt(l.group());
                out.writeBoolean(l.inStep());
                out.write(l.lease().toBytes());
                writeLongs(out, l.blockIds());
            }
            for (Save s : saves) {
                out.writeUTF(s.requestId());
                out.writeInt(s.group());
                writeLongs(out, s.blockIds());
                out.writeInt(s.hashes().hashLen());
                out.write(s.hashes().packed());
            }
            for (String id : preempted) {
                out.writeUTF(id);
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return bytes.toByteArray();
    }

    public static StepPlan decode(byte[] data) {
        if (data.length == 0) {
            return new StepPlan(List.of(), List.of(), List.of());
        }
        try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(data))) {
            int version = in.readInt();
            if (version != VERSION) {
                throw new InvalidArgumentException("step plan version " + version + "; expected " + VERSION
                        + " (scheduler and worker run different pegaflow versions)");
            }
            int nLoads = in.readInt();
            int nSaves = in.readInt();
            int nPreempted = in.readInt();
            if (nLoads < 0 || nSaves < 0 || nPreempted < 0) {
                throw new InvalidArgumentException("step plan counts " + nLoads + "/" + nSaves + "/" + nPreempted
                        + "; expected >= 0");
            }
            List<Load> loads = new ArrayList<>();
            for (int i = nLoads; i > 0; i--) {
                String id = in.readUTF();
                int group = in.readInt();
                boolean inStep = in.readBoolean();
                byte[] lease = new byte[Token.BYTES];
                in.readFully(lease);
                loads.add(new Load(id, group, Token.fromBytes(lease), readLongs(in), inStep));
            }
            List<Save> saves = new ArrayList<>();
            for (int i = nSaves; i > 0; i--) {
                String id = in.readUTF();
                int group = in.readInt();
                long[] blocks = readLongs(in);
                int len = in.readInt();
                if (len < 0 || (long) len * blocks.length > data.length) {
                    throw new InvalidArgumentException("step plan save of request " + id + ": " + blocks.length
                            + " hashes of " + len + " bytes exceed the plan's " + data.length + " bytes");
                }
                byte[] packed = new byte[blocks.length * len];
                in.readFully(packed);
                saves.add(new Save(id, group, blocks, blocks.length == 0 ? BlockHashes.EMPTY : new BlockHashes(packed, len)));
            }
            List<String> preempted = new ArrayList<>();
            for (int i = nPreempted; i > 0; i--) {
                preempted.add(in.readUTF());
            }
            return new StepPlan(loads, saves, preempted);
        } catch (IOException e) {
            throw new InvalidArgumentException("step plan of " + data.length + " bytes is truncated or corrupt: " + e);
        }
    }

    private static void writeLongs(DataOutputStream out, long[] v) throws IOException {
        out.writeInt(v.length);
        for (long x : v) {
            out.writeLong(x);
        }
    }

    private static long[] readLongs(DataInputStream in) throws IOException {
        int n = in.readInt();
        if (n < 0 || n > in.available() / Long.BYTES) {
            throw new IOException(n + " block ids announced, " + in.available() + " bytes left");
        }
        long[] v = new long[n];
        for (int i = 0; i < v.length; i++) {
            v[i] = in.readLong();
        }
        return v;
    }
}
