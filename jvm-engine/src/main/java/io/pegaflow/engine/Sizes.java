package io.pegaflow.engine;

import java.math.BigDecimal;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Byte sizes as users write them: {@code 30gb}, {@code 64MiB}, {@code 1.5g}, {@code 4096}.
 * Units are binary (1 kb = 1024 bytes), as in the original PegaFlow's {@code --pool-size}.
 */
public final class Sizes {
    private static final Pattern SIZE = Pattern.compile("\\s*(\\d+(?:\\.\\d+)?)\\s*([kmgt]?)(?:i?b)?\\s*");

    private Sizes() {}

    /**
     * Parses a size. Throws {@link InvalidArgumentException} naming the text when it is not a
     * non-negative number with an optional unit of b, kb, mb, gb or tb.
     */
    public static long parse(String text) {
        if (text == null) {
            throw new InvalidArgumentException("size is null; expected a size like 30gb, 512mb or 4096");
        }
        Matcher m = SIZE.matcher(text.toLowerCase(Locale.ROOT));
        if (!m.matches()) {
            throw new InvalidArgumentException(
                    "size '" + text + "' is not a size; expected a number with an optional unit b, kb, mb, gb or tb (binary), like 30gb");
        }
        int shift = switch (m.group(2)) {
            case "k" -> 10;
            case "m" -> 20;
            case "g" -> 30;
            case "t" -> 40;
            default -> 0;
        };
        BigDecimal bytes = new BigDecimal(m.group(1)).multiply(BigDecimal.valueOf(1L << shift));
        if (bytes.compareTo(BigDecimal.valueOf(Long.MAX_VALUE)) > 0) {
            throw new InvalidArgumentException("size '" + text + "' is larger than " + Long.MAX_VALUE + " bytes");
        }
        return bytes.setScale(0, java.math.RoundingMode.CEILING).longValueExact();
    }

    /** Formats bytes with the largest binary unit that keeps one decimal, e.g. {@code 1.5 GiB}. */
    public static String format(long bytes) {
        String[] units = {"B", "KiB", "MiB", "GiB", "TiB"};
        double v = bytes;
        int u = 0;
        while (Math.abs(v) >= 1024 && u < units.length - 1) {
            v /= 1024;
            u++;
        }
        return u == 0 ? bytes + " B" : String.format(Locale.ROOT, "%.1f %s", v, units[u]);
    }
}
