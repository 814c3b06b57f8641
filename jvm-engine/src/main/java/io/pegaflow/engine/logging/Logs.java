package io.pegaflow.engine.logging;

import io.pegaflow.engine.InvalidArgumentException;
import java.io.PrintStream;
import java.util.Locale;
import java.util.logging.Formatter;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

/**
 * The process's one log handler: a line per record on standard error, {@link Format#TEXT} or
 * {@link Format#JSON}. Called by each entry point (the server's main, the bridge's bootstrap)
 * before anything logs; calling again replaces the handler.
 */
public final class Logs {
    /** How each record is written. */
    public enum Format {
        /** {@code 2026-12-02T16:34:24.123Z INFO [main] io.pegaflow.server.PegaflowServer: pool: ...} */
        TEXT,
        /** {@code {"ts":"...","level":"INFO","logger":"...","thread":"main","msg":"..."}} */
        JSON
    }

    /** The loggers whose levels are set: held strongly, as JUL keeps loggers only weakly. */
    private static final Logger ROOT = Logger.getLogger("");
    private static final Logger PEGAFLOW = Logger.getLogger("io.pegaflow");

    private Logs() {}

    /**
     * Parses {@code --log-level} and {@code --log-format} and configures the process; a value
     * outside the choices is an {@link InvalidArgumentException} naming the flag.
     */
    public static void configure(String level, String format) {
        configure(level(level), format(format));
    }

    /**
     * Installs one handler on the root logger writing {@code format} lines to standard error.
     * PegaFlow's loggers log at {@code level}; everyone else (gRPC, Netty, Lettuce) at INFO or
     * {@code level} if that is coarser: their FINE records are per HTTP/2 frame.
     */
    public static void configure(Level level, Format format) {
        configure(level, format, System.err);
    }

    /** As {@link #configure(Level, Format)}, writing to {@code out} (tests). */
    public static synchronized void configure(Level level, Format format, PrintStream out) {
        for (Handler h : ROOT.getHandlers()) {
            ROOT.removeHandler(h);
            h.close();
        }
        ROOT.addHandler(new LineHandler(out, format == Format.JSON ? new JsonLineFormatter() : new TextLineFormatter()));
        ROOT.setLevel(level.intValue() > Level.INFO.intValue() ? level : Level.INFO);
        PEGAFLOW.setLevel(level);
    }

    /** {@code --log-level}: error, warn, info, debug, trace (case-insensitive). */
    public static Level level(String name) {
        return switch (name == null ? "" : name.toLowerCase(Locale.ROOT)) {
            case "error" -> Level.SEVERE;
            case "warn", "warning" -> Level.WARNING;
            case "info" -> Level.INFO;
            case "debug" -> Level.FINE;
            case "trace" -> Level.FINEST;
            default -> throw new InvalidArgumentException("--log-level '" + name + "'; expected error, warn, info, debug or trace");
        };
    }

    /** {@code --log-format}: text or json (case-insensitive). */
    public static Format format(String name) {
        return switch (name == null ? "" : name.toLowerCase(Locale.ROOT)) {
            case "text" -> Format.TEXT;
            case "json" -> Format.JSON;
            default -> throw new InvalidArgumentException("--log-format '" + name + "'; expected text or json");
        };
    }

    /** The level's name as written: ERROR, WARN, INFO, DEBUG (FINE, CONFIG), TRACE (FINER, FINEST). */
    static String levelName(Level level) {
        int v = level.intValue();
        if (v >= Level.SEVERE.intValue()) {
            return "ERROR";
        } else if (v >= Level.WARNING.intValue()) {
            return "WARN";
        } else if (v >= Level.INFO.intValue()) {
            return "INFO";
        } else if (v >= Level.FINE.intValue()) {
            return "DEBUG";
        }
        return "TRACE";
    }

    /** Writes each formatted record with one {@code print}: a line is never interleaved with another. */
    private static final class LineHandler extends Handler {
        private final PrintStream out;

        LineHandler(PrintStream out, Formatter formatter) {
            this.out = out;
            setFormatter(formatter);
            setLevel(Level.ALL);
        }

        @Override
        public void publish(LogRecord record) {
            if (!isLoggable(record)) {
                return;
            }
            String line;
            try {
                line = getFormatter().format(record);
            } catch (RuntimeException e) {
                reportError("cannot format a log record", e, java.util.logging.ErrorManager.FORMAT_FAILURE);
                return;
            }
            out.print(line);
            out.flush();
        }

        @Override
        public void flush() {
            out.flush();
        }

        @Override
        public void close() {
            out.flush();
        }
    }
}
