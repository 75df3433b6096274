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
 *  "at":1764554400123,"body":"CANDIDATE'S BODY, AT MOST 4096 CHARACTERS"}
 * </pre>
 *
 * <p>{@code kind} is {@code shadow} or {@code canary}; {@code status} 0 means no answer (with
 * {@code error}), -1 a mirror dropped at the in-flight limit (with {@code error}); {@code at} is
 * when the request was routed (epoch ms), {@code ms} how long the candidate took.
 *
 * <p>With a cap ({@link #cap}, the agent's {@code live-log-bytes} option: the server's disk budget),
 * the file and its one backup {@code NAME.1} stay within it: a line that would take the file past
 * half the cap first renames it to its backup (the readers follow that: backup, then the file).
 */
final class LiveLog {
    static final int MAX_BODY = 4096;
    static final int MAX_QUEUED = 100_000;
    static final long FLUSH_MS = 200;

    private record Line(Path file, String json) {
    }

    private static final BlockingQueue<Line> QUEUE = new LinkedBlockingQueue<>(MAX_QUEUED);
    private static final AtomicLong LOST = new AtomicLong();
    private static final Object WRITING = new Object();
    private static volatile boolean started;
    /** The file and its backup together at most this many bytes; 0: no cap. */
    private static volatile long cap;

    private LiveLog() {
    }

    /** One record; never blocks (a full queue loses the line, counted in the next error). */
    static void append(Path file, String kind, String of, String id, String version, int status,
                       double ms, long at, String body, String error) {
        StringBuilder line = new StringBuilder(256 + (body == null ? 0 : Math.min(body.length(), MAX_BODY)));
        line.append("{\"kind\":").append(Json.quote(kind))
                .append(",\"of\":").append(Json.quote(of))
                .append(",\"id\":").append(Json.quote(id == null ? "" : id))
                .append(",\"version\":").append(Json.quote(version))
                .append(",\"status\":").append(status)
                .append(",\"ms\":").append(String.format(Locale.ROOT, "%.2f", ms))
                .append(",\"at\":").append(at)
                .append(",\"body\":").append(Json.quote(truncate(body)));
        if (error != null) {
            line.append(",\"error\":").append(Json.quote(error));
        }
        line.append("}\n");
        if (!started) {
            start();
        }
        if (!QUEUE.offer(new Line(file, line.toString()))) {
            LOST.incrementAndGet();
        }
    }

    /** Cap the live log and its backup at {@code bytes} together (0: no cap). */
    static void cap(long bytes) {
        cap = bytes;
    }

    static String truncate(String body) {
        if (body == null) {
            return "";
        }
        return body.length() <= MAX_BODY ? body : body.substring(0, MAX_BODY);
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
                Agent.log("live log: " + lost + " lines lost (more than " + MAX_QUEUED + " waiting)");
            }
            for (Line line : lines) {
                try {
                    byte[] bytes = line.json().getBytes(StandardCharsets.UTF_8);
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
