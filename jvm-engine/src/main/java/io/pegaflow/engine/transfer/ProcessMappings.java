package io.pegaflow.engine.transfer;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * This process's memory mappings as Linux lists them in {@code /proc/self/maps}: where a host
 * copy may read and write. Why: a region registered for host copies is a raw address from the
 * caller; copying from one that is not mapped, or not writable, ends the process with SIGSEGV
 * instead of an error. Checked once per region at registration, never on the copy path.
 */
final class ProcessMappings {
    private static final Path MAPS = Path.of("/proc/self/maps");

    /** One mapping: {@code [start, end)} and its permissions as the kernel prints them ({@code rw-p}). */
    record Mapping(long start, long end, String perms) {
        boolean readWrite() {
            return perms.length() >= 2 && perms.charAt(0) == 'r' && perms.charAt(1) == 'w';
        }
    }

    private ProcessMappings() {}

    /** The mappings in address order, or null where the process has no {@code /proc/self/maps}. */
    static List<Mapping> read() {
        List<String> lines;
        try {
            lines = Files.readAllLines(MAPS);
        } catch (IOException | UnsupportedOperationException e) {
            return null;
        }
        List<Mapping> out = new ArrayList<>(lines.size());
        for (String line : lines) {
            Mapping m = parse(line);
            if (m != null) {
                out.add(m);
            }
        }
        return out;
    }

    /** One line ({@code start-end perms offset dev inode [path]}), or null for one this cannot use. */
    static Mapping parse(String line) {
        int dash = line.indexOf('-');
        int space = line.indexOf(' ');
        if (dash <= 0 || space <= dash) {
            return null;
        }
        try {
            long start = Long.parseUnsignedLong(line, 0, dash, 16);
            long end = Long.parseUnsignedLong(line, dash + 1, space, 16);
            int permsEnd = line.indexOf(' ', space + 1);
            String perms = line.substring(space + 1, permsEnd < 0 ? line.length() : permsEnd);
            // the kernel's own range (vsyscall) lies above every user address: never a region
            return start < 0 || end < 0 || end <= start ? null : new Mapping(start, end, perms);
        } catch (NumberFormatException e) {
            return null;
        }
    }

    /**
     * Null when {@code [address, address + bytes)} lies in readable and writable mappings that
     * follow each other without a gap; otherwise what is wrong, naming the first address that
     * is not covered and what is there.
     */
    static String uncovered(List<Mapping> maps, long address, long bytes) {
        long end = address + bytes;
        long cursor = address;
        for (Mapping m : maps) {
            if (m.end() <= cursor) {
                continue;
            }
            if (m.start() > cursor) {
                break; // a gap before this mapping
            }
            if (!m.readWrite()) {
                return String.format("0x%x lies in a mapping this process may not both read and write (%s, 0x%x-0x%x)",
                        cursor, m.perms(), m.start(), m.end());
            }
            cursor = m.end();
            if (cursor >= end) {
                return null;
            }
        }
        return String.format("0x%x is not mapped in this process", cursor);
    }
}
