package io.pegaflow.engine.hash;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import java.util.HexFormat;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * Golden vectors printed by vLLM 0.33's own {@code init_none_hash} + {@code hash_block_tokens}
 * with PYTHONHASHSEED=0, tokens 1..4 then 5..8 in blocks of 4 (the xxhash_cbor row is also the
 * one PegaInfer pins). The Python integration test checks random token lists against the
 * installed vLLM; these keep the Java side checked where no vLLM is installed.
 */
class VllmBlockHasherTest {
    private static final HexFormat HEX = HexFormat.of();

    @ParameterizedTest
    @CsvSource({
        "xxhash_cbor, 1ebe36576dcb573f26b99533a20aaeca, 0a8577df5ee3430515a8cc1f6e3ac52e, d152782cb4d753bde718a811a3b75e23",
        "xxhash, 6fb31cc38bba6066183f7f2104b9c051, f3856cedd7e636094750c4546e855397, 0c9832567b17003b126077f57e0bb670",
        "sha256_cbor, 4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e, "
                + "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb, "
                + "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6",
        "sha256, 1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c, "
                + "762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d, "
                + "9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b",
    })
    void matchesVllmsChainForSeedZero(String algo, String none, String first, String second) {
        VllmBlockHasher h = new VllmBlockHasher(VllmBlockHasher.Algorithm.of(algo), "0");
        assertThat(HEX.formatHex(h.noneHash())).isEqualTo(none);
        BlockHashes chain = h.chain(null, new int[] {1, 2, 3, 4, 5, 6, 7, 8, 9}, 4);
        assertThat(chain.count()).isEqualTo(2); // the partial block 9 is not keyed
        assertThat(chain.hex(0)).isEqualTo(first);
        assertThat(chain.hex(1)).isEqualTo(second);
        // continuing from the first block's hash gives the rest of the chain
        assertThat(h.chain(HEX.parseHex(first), new int[] {5, 6, 7, 8}, 4).hex(0)).isEqualTo(second);
    }

    @ParameterizedTest
    @CsvSource({"xxhash", "xxhash_cbor"})
    void xxhashWithoutASeedIsRefusedWithTheReason(String algo) {
        assertThatThrownBy(() -> new VllmBlockHasher(VllmBlockHasher.Algorithm.of(algo), null))
                .isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("PYTHONHASHSEED");
    }
}
