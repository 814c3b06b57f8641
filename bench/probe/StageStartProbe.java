import io.pegaflow.engine.*;
import io.pegaflow.engine.transfer.*;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;

/**
 * How soon a load staged at its lookup (PEGAFLOW_PRESTAGE_MIB) has its first group queued, without
 * a GPU: a 1,024-block Llama-3.1-8B prefix (32 layers, two 32 KiB pieces per layer and block, as
 * in PlanSplitProbe), looked up with queryAndBegin on an engine whose Stager records when its
 * staging thread queues each group and copies nothing, then loaded layer-wise (claiming the
 * staging) on a copy engine that moves nothing but waits for each staged group as a real one does. Prints means over the second half of SECONDS of
 * back-to-back requests (the first half warms the JIT): the queryAndBegin call on the caller's
 * thread, from its return to group 0 queued on the staging thread (the layout made there, the
 * thread's wake-up), and to the last group queued:
 *   java --enable-native-access=ALL-UNNAMED -cp bench/target/pegaflow.jar bench/probe/StageStartProbe.java SECONDS
 */
public class StageStartProbe {
  static final int BLOCKS = 1024, LAYERS = 32;
  static final long PIECE = 32 << 10;
  static volatile long firstGroup, lastGroup;

  static final class Recording extends Stager {
    Recording(long bytes) { super(bytes, "probe"); }
    @Override protected void allocate() {}
    @Override protected void free() {}
    @Override public long address() { return 0; }
    @Override protected void queueGroup(StageLayout layout, int g) {
      long now = System.nanoTime();
      if (g == 0) firstGroup = now;
      if (g == layout.groups() - 1) lastGroup = now;
    }
    @Override protected boolean landed(int g) { return true; }
  }

  public static void main(String[] a) throws Exception {
    Recording stager = new Recording(BLOCKS * LAYERS * 2 * PIECE);
    TransferEngine nothing = new TransferEngine() {
      @Override public TransferFuture submit(CopyBatch batch) {
        for (int g = 0; batch.stage() != null && g < batch.groupCount(); g++) {
          batch.stage().awaitQueued(g); // as a real engine reads each group once it is staged
        }
        TransferFuture f = new TransferFuture();
        f.complete(null);
        return f;
      }
      @Override public Stager stager() { return stager; }
      @Override public String name() { return "nothing"; }
      @Override public void close() { stager.close(); }
    };
    PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolBytes(BLOCKS * LAYERS * 2 * PIECE + (64L << 20))
        .sweepInterval(Duration.ZERO).transfer(pool -> nothing).build());
    engine.registerInstance(new InstanceSpec("bench", "bench-ns", 1, 1));
    List<LayerRegion> layers = new ArrayList<>();
    long base = 1L << 40; // never dereferenced: nothing moves
    for (int l = 0; l < LAYERS; l++) {
      long bytes = 2L * 2 * BLOCKS * PIECE;
      layers.add(new LayerRegion("model.layers." + l + ".self_attn.attn", KvLayout.SPLIT_KV, base, bytes, 2 * BLOCKS,
          PIECE, PIECE, 2L * BLOCKS * PIECE));
      base += bytes;
    }
    engine.registerWorker("bench", new WorkerSpec(0, 0, 0, layers));
    byte[] packed = new byte[BLOCKS * 32];
    new Random(1).nextBytes(packed);
    BlockHashes hashes = new BlockHashes(packed, 32);
    long[] src = new long[BLOCKS], dst = new long[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) { src[i] = i; dst[i] = BLOCKS + i; }
    engine.save("bench", 0, src, hashes).get(60, TimeUnit.SECONDS);
    engine.flush(60_000);
    long start = System.nanoTime(), half = start + Long.parseLong(a[0]) * 500_000_000L, end = half + (half - start);
    long n = 0, lookup = 0, first = 0, last = 0, notStaged = 0;
    while (System.nanoTime() < end) {
      firstGroup = 0; lastGroup = 0;
      long t0 = System.nanoTime();
      QueryResult q = engine.queryAndBegin("bench", hashes, 0);
      long t1 = System.nanoTime();
      LayeredLoad load = engine.loadLayered("bench", 0, q.lease(), dst);
      load.result().join();
      if (t0 >= half) {
        if (!load.fromStage()) { notStaged++; continue; }
        n++; lookup += t1 - t0; first += firstGroup - t1; last += lastGroup - t1;
      }
    }
    System.out.printf("{\"requests\": %d, \"not_staged\": %d, \"query_and_begin_ms\": %.3f, \"to_first_group_queued_ms\": %.3f, "
        + "\"to_last_group_queued_ms\": %.3f}%n", n, notStaged, lookup / 1e6 / n, first / 1e6 / n, last / 1e6 / n);
    engine.close();
  }
}
