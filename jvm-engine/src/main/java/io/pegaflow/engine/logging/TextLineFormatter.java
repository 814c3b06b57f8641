package io.pegaflow.engine.logging;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.util.logging.Formatter;
import java.util.logging.LogRecord;

/**
 * {@code <UTC instant> <LEVEL> [<thread>] <logger>: <message>[ | <stack trace>]}, one line: CR
 * and LF in the message or the trace are written as {@code \r} and {@code \n} (and a
 * backslash as {@code \\}), so every line is one record.
 */
final class TextLineFormatter extends Formatter {
    @Override
    public String format(LogRecord r) {
        StringBuilder sb = new StringBuilder(160);
        sb.append(r.getInstant()).append(' ').append(Logs.levelName(r.getLevel())).append(" [")
                .append(JsonLineFormatter.threadName(r)).append("] ").append(r.getLoggerName()).append(": ");
        escape(sb, formatMessage(r));
        if (r.getThrown() != null) {
            sb.append(" | ");
            escape(sb, stackTrace(r.getThrown()).stripTrailing());
        }
        return sb.append('\n').toString();
    }

    /** A record's stack trace is cut here, so a deep recursion cannot make a line of megabytes. */
    static final int MAX_TRACE_CHARS = 16 * 1024;

    static String stackTrace(Throwable t) {
        StringWriter w = new StringWriter();
        t.printStackTrace(new PrintWriter(w));
        String s = w.toString();
        return s.length() <= MAX_TRACE_CHARS ? s : s.substring(0, MAX_TRACE_CHARS) + "... (" + s.length() + " characters)";
    }

    private static void escape(StringBuilder sb, String s) {
        if (s == null) {
            sb.append("null");
            return;
        }
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\\' -> sb.append("\\\\");
                case '\t' -> sb.append('\t');
                default -> sb.append(c < 0x20 || c == 0x7f ? '?' : c);
            }
        }
    }
}
