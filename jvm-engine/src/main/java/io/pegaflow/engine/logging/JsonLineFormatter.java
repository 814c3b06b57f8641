package io.pegaflow.engine.logging;

import java.util.logging.Formatter;
import java.util.logging.LogRecord;

/**
 * One JSON object per line: {@code ts} (UTC instant), {@code level} (ERROR, WARN, INFO, DEBUG,
 * TRACE), {@code logger}, {@code thread}, {@code msg}, and {@code exception} (the stack trace)
 * when the record has one.
 */
final class JsonLineFormatter extends Formatter {
    @Override
    public String format(LogRecord r) {
        StringBuilder sb = new StringBuilder(200);
        sb.append("{\"ts\":\"").append(r.getInstant()).append("\",\"level\":\"").append(Logs.levelName(r.getLevel()))
                .append("\",\"logger\":");
        quote(sb, r.getLoggerName());
        sb.append(",\"thread\":");
        quote(sb, threadName(r));
        sb.append(",\"msg\":");
        quote(sb, formatMessage(r));
        if (r.getThrown() != null) {
            sb.append(",\"exception\":");
            quote(sb, TextLineFormatter.stackTrace(r.getThrown()).stripTrailing());
        }
        return sb.append("}\n").toString();
    }

    /** The logging thread's name when it is the current one (the usual case), else its id. */
    static String threadName(LogRecord r) {
        Thread t = Thread.currentThread();
        return t.threadId() == r.getLongThreadID() ? t.getName() : "tid-" + r.getLongThreadID();
    }

    /** {@code s} as a JSON string (RFC 8259): quotes, backslashes and control characters escaped. */
    static void quote(StringBuilder sb, String s) {
        if (s == null) {
            sb.append("null");
            return;
        }
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\t' -> sb.append("\\t");
                default -> {
                    if (c < 0x20 || c == 0x2028 || c == 0x2029) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        sb.append('"');
    }
}
