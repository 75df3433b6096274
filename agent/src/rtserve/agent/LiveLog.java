package rtserve.agent;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The live log: one JSON line per mirrored or forwarded request, appended to the routes' {@code log}
 * by one writer thread (callers only queue a line), flushed when the queue runs dry and at least
 * every 200 ms, and at the JVM's exit.
 *
 * <pre>
 * {"kind":"shadow","of":"ORIGINAL-ID","id":"CANDIDATE-ID","version":"2.0","status":200,"ms":12.34,
 *  "at":1764554400123,"body":"CANDIDATE'S WHOLE BODY"}
 * </pre>
 *
 * <p>{@code kind} is {@code shadow} or {@code canary}; {@code status} 0 means no answer (with
 * {@code error}), -1 a line dropped (with {@code error}): a mirror at the in-flight limit, or an
 * answer with more than {@link #MAX_QUEUED_BYTES} bytes of lines already waiting; {@code at} is
 * when the request was routed (epoch ms), {@code ms} how long the candidate took.
 *
 * <p>The body is the candidate's whole answer. One that cannot be kept whole is written as
 * {@code "body":"","truncated":true} (status, id and time kept), never cut: an answer longer than
 * the frontend's {@code max_response_size} (TorchServe's most for an answer; read from the
 * frontend's configuration, {@link #limitBodies}, else TorchServe's default 6,553,500), or a line
 * longer than half the cap (one file could not hold it) or a quarter of the queue's bytes.
 *
 * <p>With a cap ({@link #cap}, the agent's {@code live-log-bytes} option: the server's disk budget),
 * the file and its one backup {@code NAME.1} stay within it: a line that would take the file past
 * half the cap first renames it to its backup (the readers follow that: backup, then the file).
 *
 * <p>The queue is bounded in lines ({@value #MAX_QUEUED}) and in bytes ({@link #MAX_QUEUED_BYTES}):
 * an answer over the bytes is replaced by its {@code status -1} line; a line with no room at all is
 * lost, counted on stderr with the next write.
 *
 * <p>The other half is Python's, in rtserve/promotion/live/: evidence.py reads this log (the shadow
 * report, the canary's decision), kubectl.py copies it out of pods.
 */
final class LiveLog {
    /** TorchServe's default {@code max_response_size}: the longest answer its frontend sends. */
    static final int DEFAULT_MAX_BODY = 6_553_500;
    static final int MAX_QUEUED = 100_000;
    /**
     * The bytes of lines waiting at most: an eighth of the frontend's 256 MiB heap (config.properties'
     * {@code vmargs}), room for five answers of TorchServe's largest.
     */
    static final long MAX_QUEUED_BYTES = 32L << 20;
    static final long FLUSH_MS = 200;

    private record Line(Path file, byte[] bytes) {
    }

    private static final BlockingQueue<Line> QUEUE = new LinkedBlockingQueue<>(MAX_QUEUED);
    private static final AtomicLong QUEUED_BYTES = new AtomicLong();
    private static final AtomicLong LOST = new AtomicLong();
    private static final Object WRITING = new Object();
    private static volatile boolean started;
    /** The file and its backup together at most this many bytes; 0: no cap. */
    private static volatile long cap;
    /** The longest body written whole (characters): the frontend's {@code max_response_size}. */
    private static volatile int maxBody = DEFAULT_MAX_BODY;

    private LiveLog() {
    }

    /**
     * One record; never blocks. A body that cannot be kept whole is marked {@code truncated}; with
     * the queue's bytes full the line becomes a {@code status -1} line; with no room for that
     * either it is lost (counted in the next write's message).
     */
    static void append(Path file, String kind, String of, String id, String version, int status,
                       double ms, long at, String body, String error) {
        String text = body == null ? "" : body;
        byte[] bytes = null;
        if (text.length() <= maxBody) {
            bytes = line(kind, of, id, version, status, ms, at, text, false, error);
            if (bytes.length > maxLine()) {
                bytes = null;
            }
        }
        if (bytes == null) {
            bytes = line(kind, of, id, version, status, ms, at, "", true, error);
        }
        if (!started) {
            start();
        }
        if (!offer(file, bytes) && !offer(file, line(kind, of, id, version, -1, ms, at, "", false,
                "dropped: more than " + MAX_QUEUED_BYTES + " bytes of the live log waiting"))) {
            LOST.incrementAndGet();
        }
    }

    /** Queue {@code bytes}; false if the queue's bytes have no room for them (a full queue of lines loses them, counted). */
    private static boolean offer(Path file, byte[] bytes) {
        if (QUEUED_BYTES.addAndGet(bytes.length) > MAX_QUEUED_BYTES) {
            QUEUED_BYTES.addAndGet(-bytes.length);
            return false;
        }
        if (!QUEUE.offer(new Line(file, bytes))) {
            QUEUED_BYTES.addAndGet(-bytes.length);
            LOST.incrementAndGet();
        }
        return true;
    }

    static byte[] line(String kind, String of, String id, String version, int status, double ms,
                       long at, String body, boolean truncated, String error) {
        StringBuilder line = new StringBuilder(256 + body.length());
        line.append("{\"kind\":").append(Json.quote(kind))
                .append(",\"of\":").append(Json.quote(of))
                .append(",\"id\":").append(Json.quote(id == null ? "" : id))
                .append(",\"version\":").append(Json.quote(version))
                .append(",\"status\":").append(status)
                .append(",\"ms\":").append(String.format(Locale.ROOT, "%.2f", ms))
                .append(",\"at\":").append(at)
                .append(",\"body\":").append(Json.quote(body));
        if (truncated) {
            line.append(",\"truncated\":true");
        }
        if (error != null) {
            line.append(",\"error\":").append(Json.quote(error));
        }
        return line.append("}\n").toString().getBytes(StandardCharsets.UTF_8);
    }

    /** The longest line kept whole (bytes): half the cap, a quarter of the queue's bytes. */
    static long maxLine() {
        long half = cap / 2;
        return half > 0 ? Math.min(half, MAX_QUEUED_BYTES / 4) : MAX_QUEUED_BYTES / 4;
    }

    /** Cap the live log and its backup at {@code bytes} together (0: no cap). */
    static void cap(long bytes) {
        cap = bytes;
    }

    /** Keep bodies of up to {@code chars} characters whole (tests; the frontend's: {@link #limitBodies}). */
    static void maxBody(int chars) {
        maxBody = chars;
    }

    /**
     * Keep bodies whole up to the frontend's {@code max_response_size}
     * ({@code ConfigManager.getInstance().getMaxResponseSize()}, through the frontend's
     * {@code loader}); without it, TorchServe's default stays (said on stderr).
     */
    static void limitBodies(ClassLoader loader) {
        try {
            Class<?> config = Class.forName("org.pytorch.serve.util.ConfigManager", false, loader);
            Object instance = config.getMethod("getInstance").invoke(null);
            int max = (int) config.getMethod("getMaxResponseSize").invoke(instance);
            if (max > 0) {
                maxBody = max;
            }
            Agent.log("live log: answers of up to " + maxBody + " characters are logged whole "
                    + "(the frontend's max_response_size)");
        } catch (ReflectiveOperationException | RuntimeException e) {
            Agent.log("live log: the frontend's max_response_size is unknown (" + e + "); answers of up to "
                    + maxBody + " characters are logged whole");
        }
    }

    private static synchronized void start() {
        if (started) {
            return;
        }
        started = true;
        Thread writer = new Thread(LiveLog::run, "rtserve-live-log");
        writer.setDaemon(true);
        writer.start();
        Runtime.getRuntime().addShutdownHook(new Thread(LiveLog::drain, "rtserve-live-log-exit"));
    }

    // The writer's state (under WRITING): the file open now, its size, the last one that failed.
    private static Path open;
    private static OutputStream out;
    private static long size;
    private static Path failed;

    private static void run() {
        while (true) {
            try {
                Line first = QUEUE.poll(FLUSH_MS, TimeUnit.MILLISECONDS);
                if (first != null) {
                    List<Line> lines = new ArrayList<>();
                    lines.add(first);
                    QUEUE.drainTo(lines, 1000);
                    write(lines);
                }
            } catch (InterruptedException e) {
                drain();
                return;
            } catch (RuntimeException e) {
                Agent.log("live log: " + e);
            }
        }
    }

    private static void drain() {
        List<Line> lines = new ArrayList<>();
        QUEUE.drainTo(lines);
        write(lines);
    }

    /**
     * Write and flush {@code lines}. A file that cannot be written loses its lines; it is said
     * once until a line reaches it again.
     */
    private static void write(List<Line> lines) {
        synchronized (WRITING) {
            long lost = LOST.getAndSet(0);
            if (lost > 0) {
                Agent.log("live log: " + lost + " lines lost (the queue full: " + MAX_QUEUED + " lines or "
                        + MAX_QUEUED_BYTES + " bytes waiting)");
            }
            try {
                writeAll(lines);
            } finally {
                QUEUED_BYTES.addAndGet(-lines.stream().mapToLong(line -> line.bytes().length).sum());
            }
        }
    }

    /** Under WRITING: each line to its file (rotating at half the cap), then a flush. */
    private static void writeAll(List<Line> lines) {
        for (Line line : lines) {
            try {
                byte[] bytes = line.bytes();
                if (!line.file().equals(open)) {
                    close();
                    openFile(line.file());
                }
                long half = cap / 2;
                if (half > 0 && size > 0 && size + bytes.length > half) {
                    close();
                    Files.move(line.file(), backup(line.file()), StandardCopyOption.REPLACE_EXISTING,
                            StandardCopyOption.ATOMIC_MOVE);
                    openFile(line.file());
                }
                out.write(bytes);
                size += bytes.length;
                failed = null;
            } catch (IOException e) {
                fail(line.file(), e);
            }
        }
        try {
            if (out != null) {
                out.flush();
            }
        } catch (IOException e) {
            fail(open, e);
        }
    }

    private static void openFile(Path file) throws IOException {
        out = new BufferedOutputStream(Files.newOutputStream(file, StandardOpenOption.CREATE,
                StandardOpenOption.APPEND, StandardOpenOption.WRITE), 1 << 16);
        open = file;
        size = Files.size(file);
    }

    /** The one backup of a live log: {@code NAME.1} beside it. */
    static Path backup(Path file) {
        return file.resolveSibling(file.getFileName() + ".1");
    }

    private static void fail(Path file, IOException e) {
        if (!file.equals(failed)) {
            Agent.log("live log: cannot append to " + file + " (" + e + ")");
            failed = file;
        }
        close();
    }

    private static void close() {
        try {
            if (out != null) {
                out.close();
            }
        } catch (IOException e) {
            Agent.log("live log: cannot close " + open + " (" + e + ")");
        }
        out = null;
        open = null;
    }
}
