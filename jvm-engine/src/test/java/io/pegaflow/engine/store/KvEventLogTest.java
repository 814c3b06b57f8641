package io.pegaflow.engine.store;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InvalidArgumentException;
import org.junit.jupiter.api.Test;

/** The store's block events: in order, bounded, and a reader that fell behind is told. */
class KvEventLogTest {
    private static byte[] hash(int i) {
        return new byte[] {(byte) i};
    }

    @Test
    void aReaderGetsEveryEventInOrderAndResumesWhereItStopped() {
        KvEventLog log = new KvEventLog(8);
        for (int i = 0; i < 5; i++) {
            log.append(KvEventLog.Kind.STORED, KvEventLog.CPU, "ns", hash(i));
        }
        KvEventLog.Batch first = log.after(0, 3);
        assertThat(first.events()).extracting(KvEventLog.Event::seq).containsExactly(1L, 2L, 3L);
        assertThat(first.gap()).isFalse();
        log.append(KvEventLog.Kind.REMOVED, KvEventLog.CPU, "ns", hash(0));
        KvEventLog.Batch rest = log.after(first.next(), 100);
        assertThat(rest.events()).extracting(KvEventLog.Event::seq).containsExactly(4L, 5L, 6L);
        assertThat(rest.events().get(2).kind().vllmName).isEqualTo("BlockRemoved");
        KvEventLog.Batch none = log.after(rest.next(), 100);
        assertThat(none.events()).isEmpty();
        assertThat(none.next()).isEqualTo(6);
        assertThat(none.gap()).isFalse();
    }

    @Test
    void aReaderThatFellBehindTheRingIsToldAndResumesAtTheOldestKept() {
        KvEventLog log = new KvEventLog(4);
        for (int i = 0; i < 10; i++) {
            log.append(KvEventLog.Kind.STORED, KvEventLog.SSD, "ns", hash(i));
        }
        KvEventLog.Batch b = log.after(2, 100); // events 3..6 were overwritten
        assertThat(b.gap()).isTrue();
        assertThat(b.events()).extracting(KvEventLog.Event::seq).containsExactly(7L, 8L, 9L, 10L);
        assertThat(log.after(0, 100).gap()).isTrue(); // from the start: 1..6 are gone
        assertThat(log.after(b.next(), 100).gap()).isFalse();
    }

    @Test
    void badReadsAndCapacitiesAreRefusedNamingTheNumbers() {
        KvEventLog log = new KvEventLog(4);
        assertThatThrownBy(() -> log.after(-1, 10)).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("events after -1");
        assertThatThrownBy(() -> log.after(0, KvEventLog.MAX_READ + 1)).isInstanceOf(InvalidArgumentException.class);
        assertThatThrownBy(() -> new KvEventLog(-1)).isInstanceOf(InvalidArgumentException.class);
        KvEventLog off = new KvEventLog(0);
        off.append(KvEventLog.Kind.STORED, KvEventLog.CPU, "ns", hash(1));
        assertThat(off.after(0, 10).events()).isEmpty();
    }

    @Test
    void aReaderOfOneNamespaceSkipsTheOthersAndResumesPastThem() {
        KvEventLog log = new KvEventLog(16);
        log.append(KvEventLog.Kind.STORED, KvEventLog.CPU, "a", hash(1));
        log.append(KvEventLog.Kind.STORED, KvEventLog.CPU, "b", hash(2));
        log.append(KvEventLog.Kind.STORED, KvEventLog.SSD, "a", hash(3));
        log.append(KvEventLog.Kind.REMOVED, KvEventLog.REMOTE, "b", hash(4));
        KvEventLog.Batch a = log.after(0, 100, "a");
        assertThat(a.events()).extracting(KvEventLog.Event::seq).containsExactly(1L, 3L);
        assertThat(a.next()).isEqualTo(4); // past b's last event: nothing to read again
        assertThat(log.after(a.next(), 100, "a").events()).isEmpty();
        KvEventLog.Batch firstOfB = log.after(0, 1, "b");
        assertThat(firstOfB.events()).extracting(KvEventLog.Event::seq).containsExactly(2L);
        assertThat(firstOfB.next()).isEqualTo(2); // stopped at max: resumes right after it
        assertThat(log.after(firstOfB.next(), 100, "b").events()).extracting(KvEventLog.Event::tier).containsExactly("REMOTE");
    }

    @Test
    void aFilteredReadLooksAtABoundedRunAndResumesWhereItStopped() {
        KvEventLog log = new KvEventLog(1024);
        for (int i = 0; i < 100; i++) {
            log.append(KvEventLog.Kind.STORED, KvEventLog.CPU, "busy", hash(i));
        }
        log.append(KvEventLog.Kind.STORED, KvEventLog.CPU, "quiet", hash(7));
        KvEventLog.Batch first = log.after(0, 2, "quiet"); // looks at 2 x SCAN_PER_EVENT events
        assertThat(first.events()).isEmpty();
        assertThat(first.next()).isEqualTo(2L * KvEventLog.SCAN_PER_EVENT);
        long next = first.next();
        KvEventLog.Batch b;
        int reads = 1;
        do {
            b = log.after(next, 2, "quiet");
            next = b.next();
            reads++;
        } while (b.events().isEmpty() && reads < 100);
        assertThat(b.events()).extracting(KvEventLog.Event::seq).containsExactly(101L);
        assertThat(reads).as("the busy namespace's 100 events, 16 a read").isEqualTo(7);
    }
}
