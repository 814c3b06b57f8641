package io.pegaflow.engine.transfer;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Host regions are checked against the process's mappings: a bad pointer is an error, not a SIGSEGV. */
class ProcessMappingsTest {
    private static LayerRegion region(long base, long bytes) {
        return new LayerRegion("l0", KvLayout.COMBINED, base, bytes, 4, bytes / 4, bytes / 4, 0);
    }

    @Test
    void linesParseAsTheKernelPrintsThem() {
        var m = ProcessMappings.parse("7f3a10000000-7f3a10021000 rw-p 00000000 00:00 0 ");
        assertThat(m).isEqualTo(new ProcessMappings.Mapping(0x7f3a10000000L, 0x7f3a10021000L, "rw-p"));
        assertThat(ProcessMappings.parse("55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/python3").readWrite()).isFalse();
        assertThat(ProcessMappings.parse("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]")).isNull();
        assertThat(ProcessMappings.parse("garbage")).isNull();
    }

    @Test
    void coverageRunsAcrossAdjacentMappingsAndStopsAtAGapOrAReadOnlyOne() {
        List<ProcessMappings.Mapping> maps = List.of(new ProcessMappings.Mapping(0x1000, 0x3000, "rw-p"),
                new ProcessMappings.Mapping(0x3000, 0x5000, "rw-s"), new ProcessMappings.Mapping(0x6000, 0x7000, "rw-p"),
                new ProcessMappings.Mapping(0x7000, 0x8000, "r--p"));
        assertThat(ProcessMappings.uncovered(maps, 0x1800, 0x3000)).isNull(); // 0x1800-0x4800 over two mappings
        assertThat(ProcessMappings.uncovered(maps, 0x4000, 0x1800)).isEqualTo("0x5000 is not mapped in this process");
        assertThat(ProcessMappings.uncovered(maps, 0x0, 0x10)).isEqualTo("0x0 is not mapped in this process");
        assertThat(ProcessMappings.uncovered(maps, 0x6800, 0x1000))
                .startsWith("0x7000 lies in a mapping this process may not both read and write (r--p");
    }

    @Test
    void theHostEngineAcceptsMemoryItOwnsAndRefusesBadPointersNamingThem(@TempDir Path dir) throws Exception {
        try (Arena arena = Arena.ofConfined(); HostTransferEngine engine = new HostTransferEngine(null, 1)) {
            MemorySegment kv = arena.allocate(1 << 20, 4096);
            engine.checkRegion(region(kv.address(), kv.byteSize()));
            // the three in-process faults the C ABI used to turn into SIGSEGV
            assertThatThrownBy(() -> engine.checkRegion(region(0x1000, 4096)))
                    .isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("region 'l0' at 0x1000 (4096 bytes): 0x1000 is not mapped in this process");
            // past its buffer: the first address beyond what the process may read and write is named
            assertThatThrownBy(() -> engine.checkRegion(region(kv.address(), 1L << 40)))
                    .isInstanceOf(InvalidArgumentException.class)
                    .hasMessageStartingWith(String.format("region 'l0' at 0x%x (%d bytes): 0x", kv.address(), 1L << 40))
                    .hasMessageEndingWith("host copies need memory this process can read and write");
            // one registration's regions, the mappings read once: the bad one among good ones is named
            LayerRegion good = region(kv.address(), kv.byteSize());
            LayerRegion bad = new LayerRegion("l1", KvLayout.COMBINED, 0x2000, 4096, 4, 1024, 1024, 0);
            engine.checkRegions(List.of(good, good));
            assertThatThrownBy(() -> engine.checkRegions(List.of(good, bad))).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageStartingWith("region 'l1' at 0x2000 (4096 bytes): 0x2000 is not mapped in this process");
            Path f = dir.resolve("ro");
            Files.write(f, new byte[1 << 16]);
            try (FileChannel ch = FileChannel.open(f, StandardOpenOption.READ)) {
                MemorySegment ro = ch.map(FileChannel.MapMode.READ_ONLY, 0, 1 << 16, arena);
                assertThatThrownBy(() -> engine.checkRegion(region(ro.address(), ro.byteSize())))
                        .isInstanceOf(InvalidArgumentException.class)
                        .hasMessageContaining("may not both read and write (r--s");
            }
        }
    }
}
