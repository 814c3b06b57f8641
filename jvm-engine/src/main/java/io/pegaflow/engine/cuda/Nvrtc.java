package io.pegaflow.engine.cuda;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Optional;

/**
 * NVRTC through Panama: compiles CUDA C++ source to a cubin for one GPU architecture. The
 * library is found by soname first ({@code libnvrtc.so.13}, then 12), then in the given
 * directories; each instance binds its handles once. {@link #compileCached} keeps cubins on
 * disk keyed by architecture, NVRTC version and a hash of source and options, so a kernel
 * is compiled once per machine, not once per process.
 */
public final class Nvrtc {
    private static final String[] SONAMES = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};

    private final String library;
    private final MethodHandle getErrorString;
    private final MethodHandle version;
    private final MethodHandle createProgram;
    private final MethodHandle compileProgram;
    private final MethodHandle getProgramLogSize;
    private final MethodHandle getProgramLog;
    private final MethodHandle getCubinSize;
    private final MethodHandle getCubin;
    private final MethodHandle destroyProgram;

    private Nvrtc(String library, SymbolLookup lookup) {
        this.library = library;
        Linker linker = Linker.nativeLinker();
        getErrorString = linker.downcallHandle(find(lookup, "nvrtcGetErrorString"), FunctionDescriptor.of(ADDRESS, JAVA_INT));
        version = bind(linker, lookup, "nvrtcVersion", ADDRESS, ADDRESS);
        createProgram = bind(linker, lookup, "nvrtcCreateProgram", ADDRESS, ADDRESS, ADDRESS, JAVA_INT, ADDRESS, ADDRESS);
        compileProgram = bind(linker, lookup, "nvrtcCompileProgram", JAVA_LONG, JAVA_INT, ADDRESS);
        getProgramLogSize = bind(linker, lookup, "nvrtcGetProgramLogSize", JAVA_LONG, ADDRESS);
        getProgramLog = bind(linker, lookup, "nvrtcGetProgramLog", JAVA_LONG, ADDRESS);
        getCubinSize = bind(linker, lookup, "nvrtcGetCUBINSize", JAVA_LONG, ADDRESS);
        getCubin = bind(linker, lookup, "nvrtcGetCUBIN", JAVA_LONG, ADDRESS);
        destroyProgram = bind(linker, lookup, "nvrtcDestroyProgram", ADDRESS);
    }

    /**
     * Opens NVRTC: by soname through the loader path, else the first {@code libnvrtc.so*}
     * found in {@code dirs}. Throws a {@link CudaException} listing every place tried.
     */
    public static Nvrtc load(List<Path> dirs) {
        List<String> tried = new ArrayList<>();
        for (String soname : SONAMES) {
            Optional<SymbolLookup> lib = open(soname);
            if (lib.isPresent()) {
                return new Nvrtc(soname, lib.get());
            }
            tried.add(soname + " (loader path)");
        }
        for (Path dir : dirs) {
            for (String soname : SONAMES) {
                Path candidate = dir.resolve(soname);
                if (Files.isRegularFile(candidate)) {
                    Optional<SymbolLookup> lib = open(candidate.toString());
                    if (lib.isPresent()) {
                        return new Nvrtc(candidate.toString(), lib.get());
                    }
                }
                tried.add(candidate.toString());
            }
        }
        throw new CudaException("NVRTC (the CUDA runtime compiler) not found; tried " + tried
                + ". Install the CUDA toolkit or the nvidia-cuda-nvrtc wheel, or set CUDA_HOME", -1);
    }

    private static Optional<SymbolLookup> open(String name) {
        try {
            return Optional.of(SymbolLookup.libraryLookup(name, Arena.global()));
        } catch (IllegalArgumentException e) {
            return Optional.empty();
        }
    }

    private static MemorySegment find(SymbolLookup lookup, String name) {
        return lookup.find(name).orElseThrow(() -> new CudaException("NVRTC symbol '" + name + "' not found", -1));
    }

    private static MethodHandle bind(Linker linker, SymbolLookup lookup, String name, MemoryLayout... args) {
        return linker.downcallHandle(find(lookup, name), FunctionDescriptor.of(JAVA_INT, args));
    }

    public String library() {
        return library;
    }

    /** {@code major.minor} of the loaded NVRTC. */
    public String version() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment major = a.allocate(JAVA_INT);
            MemorySegment minor = a.allocate(JAVA_INT);
            check(call(version, major, minor), "nvrtcVersion");
            return major.get(JAVA_INT, 0) + "." + minor.get(JAVA_INT, 0);
        }
    }

    /**
     * Compiles {@code source} for {@code sm_<arch>} (e.g. 90) and returns the cubin. A
     * compile error throws with NVRTC's log in the message.
     */
    public byte[] compile(String source, String name, int arch, List<String> extraOptions) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment progOut = a.allocate(JAVA_LONG);
            check(call(createProgram, progOut, a.allocateFrom(source), a.allocateFrom(name), 0, MemorySegment.NULL,
                    MemorySegment.NULL), "nvrtcCreateProgram(" + name + ")");
            long prog = progOut.get(JAVA_LONG, 0);
            try {
                List<String> options = new ArrayList<>();
                options.add("--gpu-architecture=sm_" + arch);
                options.addAll(extraOptions);
                MemorySegment optv = a.allocate(ADDRESS, options.size());
                for (int i = 0; i < options.size(); i++) {
                    optv.setAtIndex(ADDRESS, i, a.allocateFrom(options.get(i)));
                }
                int rc = call(compileProgram, prog, options.size(), optv);
                if (rc != 0) {
                    throw new CudaException("NVRTC could not compile " + name + " for sm_" + arch + " with " + options
                            + ": " + errorString(rc) + "\n" + log(a, prog), rc);
                }
                MemorySegment size = a.allocate(JAVA_LONG);
                check(call(getCubinSize, prog, size), "nvrtcGetCUBINSize");
                MemorySegment cubin = a.allocate(size.get(JAVA_LONG, 0));
                check(call(getCubin, prog, cubin), "nvrtcGetCUBIN");
                return cubin.toArray(JAVA_BYTE);
            } finally {
                progOut.set(JAVA_LONG, 0, prog);
                call(destroyProgram, progOut);
            }
        }
    }

    /**
     * {@link #compile} through a disk cache: {@code cacheDir/<name>-sm_<arch>-<hash>.cubin},
     * the hash covering source, options and NVRTC version. A cache that cannot be written
     * (read-only home) only costs a compile per process.
     */
    public byte[] compileCached(String source, String name, int arch, List<String> extraOptions, Path cacheDir) {
        String key = sha256(source + "\u0000" + extraOptions + "\u0000" + version()).substring(0, 16);
        Path file = cacheDir.resolve(name.replaceAll("[^A-Za-z0-9_.-]", "_") + "-sm_" + arch + "-" + key + ".cubin");
        try {
            if (Files.isRegularFile(file)) {
                return Files.readAllBytes(file);
            }
        } catch (IOException unreadable) {
            // fall through to compiling
        }
        byte[] cubin = compile(source, name, arch, extraOptions);
        try {
            Files.createDirectories(cacheDir);
            Path tmp = Files.createTempFile(cacheDir, "cubin", ".tmp");
            Files.write(tmp, cubin);
            try {
                Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE);
            } catch (AtomicMoveNotSupportedException e) {
                Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING);
            }
        } catch (IOException notCached) {
            // the compiled kernel is still returned
        }
        return cubin;
    }

    private String log(Arena a, long prog) {
        MemorySegment size = a.allocate(JAVA_LONG);
        if (call(getProgramLogSize, prog, size) != 0) {
            return "(no log)";
        }
        MemorySegment text = a.allocate(Math.max(1, size.get(JAVA_LONG, 0)));
        if (call(getProgramLog, prog, text) != 0) {
            return "(no log)";
        }
        return text.getString(0);
    }

    private String errorString(int rc) {
        try {
            MemorySegment p = (MemorySegment) getErrorString.invokeExact(rc);
            return p.reinterpret(1024).getString(0) + " (nvrtcResult " + rc + ")";
        } catch (Throwable t) {
            return "nvrtcResult " + rc;
        }
    }

    private void check(int rc, String call) {
        if (rc != 0) {
            throw new CudaException(call + " failed: " + errorString(rc) + " [" + library + "]", rc);
        }
    }

    private static int call(MethodHandle h, Object... args) {
        try {
            return (int) h.invokeWithArguments(args);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new CudaException("NVRTC call failed: " + t, t);
        }
    }

    static String sha256(String text) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8)));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
