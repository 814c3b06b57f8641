import io.pegaflow.engine.cuda.*;
import io.pegaflow.engine.pool.HostPool;
import java.lang.foreign.*;
import java.util.*;

/** The copy kernel alone, in variants (see README.md here). Output: kernel-probe-h200.log. */
public class Probe {
  static CudaDevice dev; static long stream; static Arena arena = Arena.ofShared();
  public static void main(String[] a) throws Exception {
    dev = CudaDevice.open(0);
    stream = CudaDriver.streamCreate(1);
    String base = CudaTransferEngine.kernelSource();
    Nvrtc nv = Nvrtc.load(CudaOptions.defaults().nvrtcDirs());
    Map<String, long[]> kernels = new LinkedHashMap<>(); // name -> {function, threads}
    String[][] variants = {
      {"t256u4", "256", base},
      {"t512u4", "512", base.replace("__launch_bounds__(256)", "__launch_bounds__(512)")},
      {"t128u4", "128", base.replace("__launch_bounds__(256)", "__launch_bounds__(128)")},
      {"t1024u4", "1024", base.replace("__launch_bounds__(256)", "__launch_bounds__(1024)")},
      {"t256u1", "256", base.replace("for (; j + 3 * step < n; j += 4 * step) {", "for (; false; ) {")},
    };
    for (String[] v : variants) {
      byte[] cubin = nv.compile(v[2], v[0] + ".cu", dev.arch(), List.of("-default-device"));
      long mod = CudaDriver.moduleLoadData(cubin);
      kernels.put(v[0], new long[]{CudaDriver.moduleGetFunction(mod, "pega_copy"), Long.parseLong(v[1])});
    }
    int layers = 32, piece = 32768, cache = 4096, moved = 1024;
    long layerBytes = 2L * cache * piece;
    long gpu = CudaDriver.memAlloc(layers * layerBytes);
    long bytes = (long) moved * layers * 2 * piece;
    // pools
    HostPool mm = HostPool.anonymous(bytes);
    CudaDriver.memHostRegister(mm.address(), bytes, 3);
    long ah = CudaDriver.memAllocHost(bytes);
    List<Integer> ids = new ArrayList<>(); for (int i = 0; i < cache; i++) ids.add(i);
    Collections.shuffle(ids, new Random(7));
    // descriptor sets (device addr, host offset)
    long[][] seq = new long[moved * layers * 2][];
    int k = 0; long h = 0;
    for (int i = 0; i < moved; i++) for (int l = 0; l < layers; l++) for (int s = 0; s < 2; s++) {
      seq[k++] = new long[]{gpu + l * layerBytes + ((long) s * cache + ids.get(i)) * piece, h}; h += piece; }
    long[][] hostShuffled = new long[seq.length][];
    List<Long> hs = new ArrayList<>(); for (long[] d : seq) hs.add(d[1]); Collections.shuffle(hs, new Random(3));
    for (int i = 0; i < seq.length; i++) hostShuffled[i] = new long[]{seq[i][0], hs.get(i)};
    long[][] devSorted = seq.clone(); Arrays.sort(devSorted, Comparator.comparingLong(d -> d[0]));
    long[][] devSortedHostSeq = new long[seq.length][]; for (int i = 0; i < seq.length; i++) devSortedHostSeq[i] = new long[]{devSorted[i][0], (long) i * piece};
    Map<String, long[][]> sets = new LinkedHashMap<>();
    sets.put("blockmajor", seq); sets.put("hostshuffled", hostShuffled); sets.put("devsorted", devSortedHostSeq);
    long staging = CudaDriver.memAllocHost(seq.length * 24L);
    long desc = CudaDriver.memAlloc(seq.length * 24L);
    MemorySegment st = MemorySegment.ofAddress(staging).reinterpret(seq.length * 24L);
    MemorySegment params = arena.allocate(ValueLayout.ADDRESS, 2);
    MemorySegment aDesc = arena.allocate(ValueLayout.JAVA_LONG), aCount = arena.allocate(ValueLayout.JAVA_INT);
    params.setAtIndex(ValueLayout.ADDRESS, 0, aDesc); params.setAtIndex(ValueLayout.ADDRESS, 1, aCount);
    aDesc.set(ValueLayout.JAVA_LONG, 0, desc); aCount.set(ValueLayout.JAVA_INT, 0, seq.length);
    int sms = dev.multiprocessors();
    for (String pool : List.of("mmap+register", "cuMemAllocHost")) {
      long hostBase = pool.startsWith("mmap") ? mm.address() : ah;
      for (var set : sets.entrySet()) {
        for (boolean toHost : new boolean[]{true, false}) {
          long[][] d = set.getValue();
          for (int i = 0; i < d.length; i++) {
            long dv = d[i][0], hv = hostBase + d[i][1];
            st.set(ValueLayout.JAVA_LONG, i * 24L, toHost ? dv : hv);
            st.set(ValueLayout.JAVA_LONG, i * 24L + 8, toHost ? hv : dv);
            st.set(ValueLayout.JAVA_LONG, i * 24L + 16, piece);
          }
          CudaDriver.memcpyHtoD(desc, staging, d.length * 24L);
          for (var kk : kernels.entrySet()) {
            for (int grid : new int[]{Math.min(d.length, 65535), sms * 2048 / (int) kk.getValue()[1]}) {
              if (!kk.getKey().equals("t256u4") && !set.getKey().equals("blockmajor")) continue;
              double[] t = new double[6];
              for (int r = 0; r < t.length; r++) {
                long t0 = System.nanoTime();
                CudaDriver.launchKernel(kk.getValue()[0], grid, (int) kk.getValue()[1], 0, stream, params);
                CudaDriver.streamSynchronize(stream);
                t[r] = (System.nanoTime() - t0) / 1e9;
              }
              Arrays.sort(t);
              System.out.printf("%-15s %-13s %-4s %-8s grid=%-6d %.1f GB/s%n", pool, set.getKey(), toHost ? "D2H" : "H2D", kk.getKey(), grid, bytes / t[3] / 1e9);
            }
          }
        }
      }
    }
  }
}
