import java.lang.reflect.Method;

/**
 * What RemoteStore's codec warm-up costs at a client's creation (once per process), timed by
 * reflection three times in a fresh JVM: the first call is what a worker pays.
 *   java -cp bench/target/pegaflow.jar bench/probe/CodecWarmUp.java
 */
public class CodecWarmUp {
    public static void main(String[] a) throws Exception {
        Method m = Class.forName("io.pegaflow.client.RemoteStore").getDeclaredMethod("warmCodecs");
        m.setAccessible(true);
        for (int i = 0; i < 3; i++) {
            long t0 = System.nanoTime();
            m.invoke(null);
            System.out.printf("warmCodecs call %d: %.1f ms%n", i + 1, (System.nanoTime() - t0) / 1e6);
        }
    }
}
