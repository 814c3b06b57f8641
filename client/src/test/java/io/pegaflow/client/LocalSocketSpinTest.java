package io.pegaflow.client;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * How long a local-socket caller spins for its answer: its own {@code PEGAFLOW_LOCAL_SPIN_US}
 * or a busy-polling server's, whichever is longer, never past 1 ms; a bad value is refused
 * naming it; a client made in a process with the variable set spins that long before it ever
 * asks the server. (That a busy-polling server's clients spin is checked against a real server
 * in the server's LocalSocketTest.)
 */
class LocalSocketSpinTest {
    @Test
    void aCallerSpinsTheLongerOfItsOwnAndTheServersSpinUpToAMillisecond() {
        assertThat(LocalSocketClient.spinNanos(0, 0)).as("neither: sleep at once").isZero();
        assertThat(LocalSocketClient.spinNanos(300_000, 0)).as("its own, whatever the server").isEqualTo(300_000);
        assertThat(LocalSocketClient.spinNanos(300_000, 5000)).as("a busy-polling server's, capped").isEqualTo(1_000_000);
        assertThat(LocalSocketClient.spinNanos(0, 200)).isEqualTo(200_000);
        assertThat(LocalSocketClient.spinNanos(800_000, 200)).isEqualTo(800_000);
    }

    @Test
    void theSpinVariableIsMicrosecondsUpToAThousand() {
        assertThat(LocalSocketClient.spinFromEnvironment(null)).isZero();
        assertThat(LocalSocketClient.spinFromEnvironment("1000")).isEqualTo(1000);
        assertThatThrownBy(() -> LocalSocketClient.spinFromEnvironment("1001")).hasMessageContaining("PEGAFLOW_LOCAL_SPIN_US=1001")
                .hasMessageContaining("0 to 1000");
        assertThatThrownBy(() -> LocalSocketClient.spinFromEnvironment("fast")).hasMessageContaining("PEGAFLOW_LOCAL_SPIN_US=fast");
    }

    @Test
    void aClientTakesItsSpinFromItsProcesssEnvironment() throws Exception {
        assertThat(childSays("300")).isEqualTo("0:300");
        assertThat(childSays(null)).as("unset: no spin of its own").isEqualTo("0:0");
        String bad = childSays("fast");
        assertThat(bad).startsWith("1:").contains("PEGAFLOW_LOCAL_SPIN_US=fast");
    }

    /** Exit status and output of {@link Child} in a JVM of its own whose environment has the variable as given (null: unset). */
    private static String childSays(String value) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
                System.getProperty("java.class.path"), Child.class.getName()).redirectErrorStream(true);
        pb.environment().remove(LocalSocketClient.SPIN_ENV);
        if (value != null) {
            pb.environment().put(LocalSocketClient.SPIN_ENV, value);
        }
        Process p = pb.start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
        assertThat(p.waitFor(60, TimeUnit.SECONDS)).isTrue();
        return p.exitValue() + ":" + out;
    }

    /** Prints the spin, µs, of a client made in this process (before any server is asked). */
    public static final class Child {
        public static void main(String[] args) {
            try {
                System.out.print(new LocalSocketClient(null).spinMicros());
            } catch (RuntimeException e) {
                System.out.print(e.getMessage());
                System.exit(1);
            }
        }
    }
}
