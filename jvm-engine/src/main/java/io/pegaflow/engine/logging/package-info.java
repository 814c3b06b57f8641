/**
 * How a PegaFlow process logs: every record one line on standard error, as text or as a JSON
 * object per line, so an operator can ship the log without a multi-line parser.
 *
 * <p>Everything logs through {@code java.util.logging}: our code (JUL and {@code System.Logger},
 * which the JDK routes to JUL), gRPC (JUL), and the SLF4J users in the jar (Netty, Lettuce,
 * Redis' auth library), which {@code slf4j-jdk14} binds to JUL; {@link Logs#configure} installs
 * the one handler every record passes. Line breaks inside a message or a stack trace are
 * escaped ({@code \n}) in the text format and encoded in JSON, so a message that carries a
 * client's text can never forge a second record.
 */
package io.pegaflow.engine.logging;
