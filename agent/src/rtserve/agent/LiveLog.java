package rtserve.agent;

import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
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

    // The writer's state (under WRITING): the file open now, and the last one that failed.
    private static Path open;
    private static Writer out;
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
                    if (!line.file().equals(open)) {
                        close();
                        out = Files.newBufferedWriter(line.file(), StandardCharsets.UTF_8,
                                StandardOpenOption.CREATE, StandardOpenOption.APPEND, StandardOpenOption.WRITE);
                        open = line.file();
                    }
                    out.write(line.json());
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
