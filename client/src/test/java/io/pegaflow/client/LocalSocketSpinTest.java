package io.pegaflow.client;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import org.junit.jupiter.api.Test;

/**
 * How long a local-socket caller spins for its answer: its own {@code PEGAFLOW_LOCAL_SPIN_US}
 * or a busy-polling server's, whichever is longer, never past 1 ms; a bad value is refused
 * naming it. (That a busy-polling server's clients spin is checked against a real server in
 * the server's LocalSocketTest.)
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
}
