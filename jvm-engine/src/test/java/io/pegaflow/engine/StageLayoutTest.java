package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.StageLayout;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The staging layout a load's lookup makes before its blocks exist ({@link
 * CopyBatches#stageLayout}) against the batch its load lists once they do ({@link
 * CopyBatches#layerMajor}): every piece of every group maps to a staging offset holding the
 * same pool bytes, pieces never share staging bytes, and the layout is as long as the bytes
 * {@link CopyBatches#stageBytes} counted on the caller's thread.
 */
class StageLayoutTest {
    private static final long SEG = 4096;

    /** Eight per-layer K/V regions of 64 blocks; a block's slots lie back to back in the pool. */
    private static LayerRegion[] worker() {
        LayerRegion[] w = new LayerRegion[8];
        for (int r = 0; r < w.length; r++) {
            long base = 1L << 40 | (long) r << 32;
            w[r] = new LayerRegion("layer" + r, KvLayout.SPLIT_KV, base, 2 * 64 * SEG, 64, SEG, SEG, 64 * SEG);
        }
        return w;
    }

    /**
     * Five blocks: three whole (every region, one run each), one split in two runs at region 3
     * (its slots in two places of the pool), one covering regions 2-5 only; pool offsets apart.
     */
    private static CopyPlan plan(LayerRegion[] w) {
        long slot = 2 * SEG;
        long whole = w.length * slot;
        int[] block = {0, 1, 2, 3, 3, 4};
        int[] region = {0, 0, 0, 0, 3, 2};
        int[] count = {8, 8, 8, 3, 5, 4};
        long[] offset = {0, whole, 5 * whole, 9 * whole, 11 * whole, 20 * whole};
        return new CopyPlan(Token.random(new java.security.SecureRandom()), CopyPlan.Direction.LOAD, 5, 0, block, region,
                count, offset, 0);
    }

    @ParameterizedTest(name = "groups of {0} bytes")
    @ValueSource(longs = {0, 2 * SEG, 3 * 2 * SEG, 1 << 20})
    void everyPieceMapsToStagedBytesOfItsOwnPoolBytes(long groupBytes) {
        LayerRegion[] w = worker();
        CopyPlan plan = plan(w);
        long[] dst = {7, 3, 60, 12, 40};
        StageLayout layout = CopyBatches.stageLayout(plan, w, groupBytes);
        assertThat(layout.laidGroups()).as("laid a group at a time, as the staging thread queues them").isZero();
        for (int g = 0; g < layout.groups(); g++) {
            layout.lay(g);
        }
        assertThat(layout.totalBytes()).isEqualTo(CopyBatches.stageBytes(plan, w)).isEqualTo((3 * 8 + 3 + 5 + 4) * 2 * SEG);
        CopyBatch batch = new CopyBatch(CopyBatch.Direction.TO_DEVICE, 16);
        CopyBatches.layerMajor(plan, w, dst, batch, groupBytes, 0, 1);
        assertThat(batch.groupCount()).isEqualTo(layout.groups());
        // the pool as staged: each staging byte remembers the pool offset it was copied from
        long[] staged = new long[(int) (layout.totalBytes() / SEG)];
        for (int k = 0; k < layout.groupEnd(layout.groups() - 1); k++) {
            for (long b = 0; b < layout.stretchLen(k); b += SEG) {
                staged[(int) ((layout.stretchAt(k) + b) / SEG)] = layout.stretchHost(k) + b;
            }
        }
        boolean[] used = new boolean[staged.length];
        StageLayout.Cursor at = layout.cursor();
        long pieces = 0;
        for (int g = 0; g < batch.groupCount(); g++) {
            at.group(g);
            for (int i = batch.groupStart(g); i < batch.groupEnd(g); i++) {
                long off = at.offset(batch.hostOffset(i), batch.length(i));
                int unit = (int) (off / SEG);
                assertThat(staged[unit]).as("group %d piece %d's staged bytes", g, i).isEqualTo(batch.hostOffset(i));
                assertThat(used[unit]).as("piece %d shares staged bytes", i).isFalse();
                used[unit] = true;
                pieces++;
            }
        }
        assertThat(pieces).isEqualTo(batch.size()).isEqualTo(staged.length);
    }

    @Test
    void aPieceOutsideItsGroupsStretchesIsRefusedNamingIt() {
        StageLayout layout = new StageLayout(new long[] {0, 8192}, new long[] {4096, 4096}, new int[] {1, 2});
        StageLayout.Cursor at = layout.cursor();
        at.group(0);
        assertThatThrownBy(() -> at.offset(8192, 4096)).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("pool offset 8192");
        assertThatThrownBy(() -> at.group(2)).hasMessageContaining("group 2 of a staged load of 2 groups");
    }

    @Test
    void aLayoutWhoseGroupsDoNotCoverItsStretchesIsRefused() {
        assertThatThrownBy(() -> new StageLayout(new long[] {0, 8192}, new long[] {4096, 4096}, new int[] {1}))
                .hasMessageContaining("groups end at stretch 1 of 2");
        assertThatThrownBy(() -> new StageLayout(new long[] {0}, new long[] {0}, new int[] {1}))
                .hasMessageContaining("stretch 0 of 0 bytes");
        assertThatThrownBy(() -> new StageLayout(new long[] {0, 1}, new long[] {4096}, new int[] {1}))
                .hasMessageContaining("2 stretch offsets for 1 lengths");
    }

    /** Two groups of one 4 KiB stretch each, at pool offsets 0 and 8192, as a lazy layout lays them. */
    private static StageLayout.Groups twoGroups(long secondLen) {
        return (g, host, len, at) -> {
            host[at] = g * 8192L;
            len[at] = g == 0 ? 4096 : secondLen;
            return at + 1;
        };
    }

    @Test
    void aLazyLayoutIsLaidInOrderAndPlacesEachGroupAfterTheOneBefore() {
        StageLayout layout = StageLayout.lazy(2, 2, 8192, twoGroups(4096));
        assertThatThrownBy(() -> layout.lay(1)).hasMessageContaining("staging group 1 laid after 0 groups");
        layout.lay(0);
        assertThat(layout.laidGroups()).isEqualTo(1);
        assertThat(layout.groupEnd(0)).isEqualTo(1);
        assertThat(layout.stretchAt(0)).isZero();
        layout.lay(0); // laid already: left as it is
        layout.lay(1);
        assertThat(layout.stretchAt(1)).isEqualTo(4096);
        assertThat(layout.groupStart(1)).isEqualTo(1);
        StageLayout.Cursor at = layout.cursor();
        at.group(1);
        assertThat(at.offset(8192 + 1024, 1024)).isEqualTo(4096 + 1024);
    }

    @Test
    void aLazyLayoutNeverPlacesAStretchPastItsBytes() {
        StageLayout over = StageLayout.lazy(2, 2, 8192, twoGroups(8192));
        over.lay(0);
        assertThatThrownBy(() -> over.lay(1)).as("refused before its copies could be queued")
                .hasMessageContaining("staging stretch 1 of 8192 bytes at 4096 passes the layout's 8192 bytes");
        StageLayout under = StageLayout.lazy(2, 2, 8192, twoGroups(2048));
        under.lay(0);
        assertThatThrownBy(() -> under.lay(1)).hasMessageContaining("staging layout of 6144 bytes for a load of 8192");
        StageLayout wild = StageLayout.lazy(1, 1, 4096, (g, host, len, at) -> at + 2);
        assertThatThrownBy(() -> wild.lay(0)).hasMessageContaining("ends at stretch 2 after 0 of at most 1");
        assertThatThrownBy(() -> StageLayout.lazy(0, 1, 4096, twoGroups(4096))).hasMessageContaining("0 groups");
    }

    @Test
    void theStagingSizeSettingIsCheckedNamingItsValue() {
        assertThat(io.pegaflow.engine.transfer.Stager.bytesFromEnvironment(null)).isZero();
        assertThat(io.pegaflow.engine.transfer.Stager.bytesFromEnvironment("4096")).isEqualTo(4096L << 20);
        assertThatThrownBy(() -> io.pegaflow.engine.transfer.Stager.bytesFromEnvironment("-1"))
                .hasMessageContaining("PEGAFLOW_PRESTAGE_MIB");
        assertThatThrownBy(() -> io.pegaflow.engine.transfer.Stager.bytesFromEnvironment("lots"))
                .hasMessageContaining("lots");
    }
}
