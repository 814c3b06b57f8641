/*
 * pegaflow_boot.h - starts the engine's JVM inside a C or C++ process, with the same rules as
 * the Python package (python/pegaflow/_bridge.py), and returns the pegaflow_api table.
 * Header-only; link with -ldl (glibc >= 2.34 has dlopen in libc). No -ljvm: the runtime is
 * found at run time.
 *
 *   char err[2048];
 *   const pegaflow_api *api = pegaflow_boot(NULL, err, sizeof err);   // jar from $PEGAFLOW_JAR
 *   if (!api) { fprintf(stderr, "%s\n", err); return 1; }
 *
 * The runtime: $PEGAFLOW_JAVA_HOME when set (the only candidate then: an explicit choice that
 * is wrong is reported, not replaced), else the first Java >= 25 of $JAVA_HOME,
 * /usr/lib/jvm/temurin-25-jdk-amd64, then every JDK under /usr/lib/jvm (judged by the
 * JAVA_VERSION line of <home>/release, as the Python package does, and by
 * <home>/lib/server/libjvm.so). When none is found, NULL and a message that lists every place
 * tried and why each was refused. A wheel's own runtime is <site-packages>/pegaflow/_jre:
 * point $PEGAFLOW_JAVA_HOME at it, and $PEGAFLOW_JAR at <site-packages>/pegaflow/_jars/pegaflow.jar.
 *
 * The rules (each one is why the Python host behaves):
 *  - ONE JVM PER PROCESS, started once: later calls return the same table; a JVM someone
 *    else created in this process is reused (attach + bootstrap), never a second one.
 *  - -Xrs: the JVM leaves SIGINT, SIGTERM and SIGQUIT to the host. Do not install handlers
 *    for SIGSEGV/SIGBUS that swallow the JVM's own (it uses them internally); chain them.
 *  - -Xms16m -Xmx512m -XX:+UseSerialGC: the pool is off-heap, the heap holds metadata only,
 *    and a small heap with no collector threads keeps the host's resident memory low.
 *  - -XX:ErrorFile=$TMPDIR/pegaflow-hs_err_pid%p.log: a crash report does not land in the
 *    host's working directory.
 *  - The C locale is saved and restored around JNI_CreateJavaVM (the JVM sets it).
 *  - FORK: the JVM's threads do not survive fork(); a child forked after the start must not
 *    call the table (it would hang) and pegaflow_boot refuses there with the parent's pid.
 *    Start children with posix_spawn / exec, or start the engine only in the child.
 *  - The VM is never destroyed: call api->shutdown() before exit (copies in flight finish,
 *    the pool is freed). $PEGAFLOW_JVM_OPTIONS adds options (space-separated).
 */
#ifndef PEGAFLOW_BOOT_H
#define PEGAFLOW_BOOT_H

#include <dirent.h>
#include <dlfcn.h>
#include <jni.h>
#include <locale.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pegaflow.h"

#define PEGAFLOW_MIN_JAVA 25

/* JNI calls written once for C and C++ (jni.h gives C++ member functions). */
#ifdef __cplusplus
#define PF_JNI_(env, fn, ...) (env)->fn(__VA_ARGS__)
#define PF_VM_(vm, fn, ...) (vm)->fn(__VA_ARGS__)
#else
#define PF_JNI_(env, fn, ...) (*(env))->fn((env), ##__VA_ARGS__)
#define PF_VM_(vm, fn, ...) (*(vm))->fn((vm), ##__VA_ARGS__)
#endif

typedef jint (*pf_create_vm_fn)(JavaVM **, void **, void *);
typedef jint (*pf_created_vms_fn)(JavaVM **, jsize, jsize *);

static const pegaflow_api *pf_boot_table_;
static pid_t pf_boot_pid_;
static pthread_mutex_t pf_boot_lock_ = PTHREAD_MUTEX_INITIALIZER;

static void pf_boot_err_(char *err, size_t cap, const char *fmt, ...) {
    if (err == NULL || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

static void pf_boot_append_(char *buf, size_t cap, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, cap - used, fmt, ap);
    va_end(ap);
}

/* Java's major version from <home>/release, or -1. */
static int pf_boot_java_major_(const char *home) {
    char path[4096];
    snprintf(path, sizeof path, "%s/release", home);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    char line[512];
    int major = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "JAVA_VERSION=\"", 14) == 0) {
            major = atoi(line + 14);
            break;
        }
    }
    fclose(f);
    return major;
}

/* 1 when home holds a usable runtime (libjvm path into lib); else appends why not to tried. */
static int pf_boot_judge_(const char *source, const char *home, char *lib, size_t libcap, char *tried,
                          size_t tcap) {
    if (home == NULL || home[0] == '\0') {
        pf_boot_append_(tried, tcap, "%s: not set; ", source);
        return 0;
    }
    int major = pf_boot_java_major_(home);
    struct stat st;
    snprintf(lib, libcap, "%s/lib/server/libjvm.so", home);
    if (major < 0) {
        pf_boot_append_(tried, tcap, "%s (%s): no readable release file; ", source, home);
    } else if (major < PEGAFLOW_MIN_JAVA) {
        pf_boot_append_(tried, tcap, "%s (%s): Java %d < %d; ", source, home, major, PEGAFLOW_MIN_JAVA);
    } else if (stat(lib, &st) != 0) {
        pf_boot_append_(tried, tcap, "%s (%s): no lib/server/libjvm.so; ", source, home);
    } else {
        return 1;
    }
    return 0;
}

static int pf_boot_find_runtime_(char *lib, size_t libcap, char *tried, size_t tcap) {
    tried[0] = '\0';
    const char *explicit_home = getenv("PEGAFLOW_JAVA_HOME");
    if (explicit_home != NULL && explicit_home[0] != '\0') {
        /* an explicit choice is the only one: a wrong one is reported, not silently replaced */
        return pf_boot_judge_("$PEGAFLOW_JAVA_HOME", explicit_home, lib, libcap, tried, tcap);
    }
    if (pf_boot_judge_("$JAVA_HOME", getenv("JAVA_HOME"), lib, libcap, tried, tcap)) return 1;
    const char *temurin = "/usr/lib/jvm/temurin-25-jdk-amd64";
    if (pf_boot_judge_(temurin, temurin, lib, libcap, tried, tcap)) return 1;
    DIR *d = opendir("/usr/lib/jvm");
    int found = 0;
    if (d != NULL) {
        struct dirent *e;
        while (!found && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.' || strcmp(e->d_name, "temurin-25-jdk-amd64") == 0) continue;
            char home[4096];
            snprintf(home, sizeof home, "/usr/lib/jvm/%s", e->d_name);
            found = pf_boot_judge_(home, home, lib, libcap, tried, tcap);
        }
        closedir(d);
    } else {
        pf_boot_append_(tried, tcap, "/usr/lib/jvm: not installed; ");
    }
    return found;
}

/*
 * Starts the JVM (once per process) with the engine jar (NULL: $PEGAFLOW_JAR) and returns
 * the table, or NULL with the reason in err. Safe to call from several threads.
 */
static const pegaflow_api *pegaflow_boot(const char *jar, char *err, size_t cap) {
    pthread_mutex_lock(&pf_boot_lock_);
    const pegaflow_api *api = NULL;
    if (pf_boot_table_ != NULL) {
        if (pf_boot_pid_ != getpid()) {
            pf_boot_err_(err, cap, "this process was forked from pid %d after that process started its JVM; the "
                         "JVM's threads do not survive fork, so the engine cannot be used here: start the child "
                         "with posix_spawn/exec, or start the engine only in the child", (int) pf_boot_pid_);
        } else {
            api = pf_boot_table_;
        }
        pthread_mutex_unlock(&pf_boot_lock_);
        return api;
    }
    if (jar == NULL) jar = getenv("PEGAFLOW_JAR");
    struct stat st;
    if (jar == NULL || stat(jar, &st) != 0) {
        pf_boot_err_(err, cap, "engine jar %s not found; expected the path of pegaflow.jar (argument or "
                     "$PEGAFLOW_JAR; built by `make build` at bench/target/pegaflow.jar, or "
                     "<site-packages>/pegaflow/_jars/pegaflow.jar in a wheel)", jar ? jar : "(not set)");
        pthread_mutex_unlock(&pf_boot_lock_);
        return NULL;
    }
    char lib[4096], tried[4096];
    if (!pf_boot_find_runtime_(lib, sizeof lib, tried, sizeof tried)) {
        pf_boot_err_(err, cap, "no Java runtime >= %d found. Tried: %sset $PEGAFLOW_JAVA_HOME to a Java %d "
                     "runtime (a JDK, or the wheel's pegaflow/_jre)", PEGAFLOW_MIN_JAVA, tried, PEGAFLOW_MIN_JAVA);
        pthread_mutex_unlock(&pf_boot_lock_);
        return NULL;
    }
    void *libjvm = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    pf_create_vm_fn create = libjvm ? (pf_create_vm_fn) dlsym(libjvm, "JNI_CreateJavaVM") : NULL;
    pf_created_vms_fn created = libjvm ? (pf_created_vms_fn) dlsym(libjvm, "JNI_GetCreatedJavaVMs") : NULL;
    if (create == NULL || created == NULL) {
        pf_boot_err_(err, cap, "cannot load %s: %s", lib, dlerror());
        pthread_mutex_unlock(&pf_boot_lock_);
        return NULL;
    }
    JavaVM *vm = NULL;
    JNIEnv *env = NULL;
    jsize existing = 0;
    if (created(&vm, 1, &existing) == JNI_OK && existing > 0) {
        if (PF_VM_(vm, AttachCurrentThread, (void **) &env, NULL) != JNI_OK) {
            pf_boot_err_(err, cap, "a JVM already runs in this process and this thread cannot attach to it");
            pthread_mutex_unlock(&pf_boot_lock_);
            return NULL;
        }
    } else {
        char classpath[4200], error_file[4200];
        const char *tmp = getenv("TMPDIR");
        snprintf(classpath, sizeof classpath, "-Djava.class.path=%s", jar);
        snprintf(error_file, sizeof error_file, "-XX:ErrorFile=%s/pegaflow-hs_err_pid%%p.log", tmp && *tmp ? tmp : "/tmp");
        JavaVMOption options[48];
        int n = 0;
        const char *fixed[] = {"-Xrs", "-Xms16m", "-Xmx512m", "-Xss2m", "-XX:+UseSerialGC",
                               "--enable-native-access=ALL-UNNAMED", "--sun-misc-unsafe-memory-access=allow"};
        options[n++].optionString = classpath;
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) options[n++].optionString = (char *) fixed[i];
        options[n++].optionString = error_file;
        char extra[4096] = "";
        const char *env_opts = getenv("PEGAFLOW_JVM_OPTIONS");
        if (env_opts != NULL) {
            snprintf(extra, sizeof extra, "%s", env_opts);
            for (char *tok = strtok(extra, " "); tok != NULL && n < 48; tok = strtok(NULL, " ")) {
                options[n++].optionString = tok;
            }
        }
        for (int i = 0; i < n; i++) options[i].extraInfo = NULL;
        JavaVMInitArgs args;
        memset(&args, 0, sizeof args);
        args.version = JNI_VERSION_10;
        args.nOptions = n;
        args.options = options;
        args.ignoreUnrecognized = JNI_FALSE;
        const char *was = setlocale(LC_ALL, NULL);
        char saved[256];
        snprintf(saved, sizeof saved, "%s", was ? was : "C");
        jint rc = create(&vm, (void **) &env, &args);
        setlocale(LC_ALL, saved);
        if (rc != JNI_OK) {
            pf_boot_err_(err, cap, "JNI_CreateJavaVM with %s failed with code %d (an option refused, or out of "
                         "memory)", lib, (int) rc);
            pthread_mutex_unlock(&pf_boot_lock_);
            return NULL;
        }
    }
    jclass cls = PF_JNI_(env, FindClass, PEGAFLOW_BOOTSTRAP_CLASS);
    jmethodID boot = cls ? PF_JNI_(env, GetStaticMethodID, cls, PEGAFLOW_BOOTSTRAP_METHOD, PEGAFLOW_BOOTSTRAP_SIGNATURE) : NULL;
    jlong table = boot ? PF_JNI_(env, CallStaticLongMethod, cls, boot) : 0;
    if (PF_JNI_(env, ExceptionCheck) || table == 0) {
        PF_JNI_(env, ExceptionDescribe);
        PF_JNI_(env, ExceptionClear);
        pf_boot_err_(err, cap, "%s.%s failed in %s: is it the engine jar?", PEGAFLOW_BOOTSTRAP_CLASS,
                     PEGAFLOW_BOOTSTRAP_METHOD, jar);
        pthread_mutex_unlock(&pf_boot_lock_);
        return NULL;
    }
    api = (const pegaflow_api *) (intptr_t) table;
    if (api->abi_version != PEGAFLOW_ABI_VERSION) {
        pf_boot_err_(err, cap, "engine jar %s speaks C ABI version %u; this header is version %d", jar,
                     api->abi_version, PEGAFLOW_ABI_VERSION);
        pthread_mutex_unlock(&pf_boot_lock_);
        return NULL;
    }
    pf_boot_table_ = api;
    pf_boot_pid_ = getpid();
    pthread_mutex_unlock(&pf_boot_lock_);
    return api;
}

#endif /* PEGAFLOW_BOOT_H */
