package io.pegaflow.server.cluster;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InvalidArgumentException;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** The registry's pure parts: lookup probes, cluster seeds, URLs in messages. */
class RegistryKeysTest {
    @Test
    void aLookupProbesPowersOfTwoMinusOneAndTheLast() {
        assertThat(RedisBlockRegistry.probes(2048)).containsExactly(0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 2047);
        assertThat(RedisBlockRegistry.probes(1)).containsExactly(0);
        assertThat(RedisBlockRegistry.probes(5)).containsExactly(0, 1, 3, 4);
        assertThat(RedisBlockRegistry.probes(65_536)).hasSize(17);
    }

    @Test
    void passwordsNeverReachAMessage() {
        assertThat(RedisBlockRegistry.redacted("redis://:s3cret@10.0.0.5:6379")).isEqualTo("redis://***@10.0.0.5:6379");
        assertThat(RedisBlockRegistry.redacted("redis://10.0.0.5:6379")).isEqualTo("redis://10.0.0.5:6379");
        assertThatThrownBy(() -> new RedisBlockRegistry.Settings("http://:s3cret@h:1", 8, Duration.ofSeconds(1),
                Duration.ofSeconds(3), 10, Duration.ofSeconds(1), null))
                .isInstanceOf(InvalidArgumentException.class).hasMessageNotContaining("s3cret").hasMessageContaining("expected redis://");
    }

    @Test
    void clusterSeedsShareTheFirstSeedsCredentials() {
        var seeds = RedisBlockRegistry.seeds("redis://:pw@h1:7000,h2:7001", Duration.ofSeconds(1));
        assertThat(seeds).hasSize(2);
        assertThat(seeds.get(1).getHost()).isEqualTo("h2");
        assertThat(seeds.get(1).getPort()).isEqualTo(7001);
        assertThat(seeds.get(1).toString()).doesNotContain("pw"); // Lettuce masks it too
        assertThat(seeds.get(1).getCredentialsProvider().resolveCredentials().block().getPassword()).isEqualTo("pw".toCharArray());
        assertThatThrownBy(() -> RedisBlockRegistry.seeds("redis://:pw@h1:7000,,h2:1", Duration.ofSeconds(1)))
                .hasMessageContaining("empty seed").hasMessageNotContaining("pw@");
    }
}
