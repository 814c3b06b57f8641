#!/usr/bin/env bash
# Prints the home of a JDK >= 25 (with javac): $JAVA_HOME if it qualifies, else the newest
# under /usr/lib/jvm. Exits 1 with what it tried when none qualifies.
set -u
tried=()
major() {  # major version from a JDK's release file
  sed -n 's/^JAVA_VERSION="\([0-9]*\).*/\1/p' "$1/release" 2>/dev/null
}
ok() {
  local home=$1 m
  m=$(major "$home")
  if [ -n "$m" ] && [ "$m" -ge 25 ] && [ -x "$home/bin/javac" ]; then
    return 0
  fi
  tried+=("$home (version ${m:-unknown}${m:+, javac $( [ -x "$home/bin/javac" ] && echo present || echo missing)})")
  return 1
}
if [ -n "${JAVA_HOME:-}" ] && ok "$JAVA_HOME"; then
  echo "$JAVA_HOME"; exit 0
fi
for home in /usr/lib/jvm/temurin-25-jdk-amd64 $(ls -d /usr/lib/jvm/*/ 2>/dev/null | sed 's:/$::' | sort -rV); do
  if ok "$home"; then echo "$home"; exit 0; fi
done
{
  echo "No JDK >= 25 with javac found. Tried: ${tried[*]:-nothing (JAVA_HOME unset, /usr/lib/jvm empty)}."
  echo "Install Temurin 25 (e.g. to /usr/lib/jvm/temurin-25-jdk-amd64) or point JAVA_HOME at a JDK 25."
} >&2
exit 1
