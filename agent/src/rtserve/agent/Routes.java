package rtserve.agent;

import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * The live routes of one model, read from the routes file (the policy; {@link Router} applies it).
 *
 * <pre>
 * {"model": "realtime-classifier",
 *  "shadow": {"version": "2.0", "percent": 100.0, "url": "http://127.0.0.1:8080/predictions/realtime-classifier/2.0"},
 *  "canary": {"version": "2.0", "percent": 10.0, "url": "...", "key_header": "x-rtserve-key"},
 *  "log": "/abs/path/live-log.jsonl",
 *  "token_file": null}
 * </pre>
 *
 * <p>{@code shadow} and {@code canary} may each be absent or null; {@code percent} is 0..100;
 * {@code key_header} may be absent or null (the client's address is then every request's key);
 * {@code token_file} null means the caller's own {@code Authorization} goes with each copy,
 * otherwise {@code Bearer <first line of that file>}. Other keys are ignored.
 *
 * <p>Sticky share: a key is in the canary when {@link #bucket} of it is below the percent; the
 * bucket is 100 times the top 53 bits of SHA-256 of the key's UTF-8 bytes (big-endian) over
 * 2^53, in [0, 100). So a key inside p% stays inside for any larger p, and another program computes
 * the same side (Python: {@code (int.from_bytes(sha256(key).digest()[:8], "big") >> 11) / 2**53 * 100},
 * {@code sticky_bucket} in rtserve/promotion/live/routes.py, which writes this file; a unit test
 * compares the two).
 *
 * <p>{@code java -cp rtserve-agent.jar rtserve.agent.Routes FILE...} checks files (a line each: the
 * routes, or {@code invalid:} and the problem; exit 1 if any is invalid);
 * {@code ... Routes --bucket KEY...} prints each key's bucket.
 */
final class Routes {
    /** The routes file does not say what {@link Routes} needs; the message names the field. */
    static final class Invalid extends Exception {
        private static final long serialVersionUID = 1L;

        Invalid(String message) {
            super(message);
        }
    }

    /** Where a share of the requests goes. */
    record Target(String version, double percent, URI url, String keyHeader) {
        String describe() {
            return version + " at " + percent + "% to " + url
                    + (keyHeader == null ? "" : " (key: " + keyHeader + " or the client's address)");
        }
    }

    final String model;
    /** Null: no shadow. */
    final Target shadow;
    /** Null: no canary. */
    final Target canary;
    final Path log;
    /** Null: the caller's own Authorization header goes with each copy. */
    final Path tokenFile;
    /** The first line of {@link #tokenFile}, or null. */
    final String token;

    private Routes(String model, Target shadow, Target canary, Path log, Path tokenFile, String token) {
        this.model = model;
        this.shadow = shadow;
        this.canary = canary;
        this.log = log;
        this.tokenFile = tokenFile;
        this.token = token;
    }

    /** The routes in {@code text} (the file's content); the token file is read here too. */
    static Routes parse(String text) throws Invalid {
        Object root;
        try {
            root = Json.parse(text);
        } catch (Json.ParseError e) {
            throw new Invalid(e.getMessage());
        }
        if (!(root instanceof Map<?, ?> top)) {
            throw new Invalid("the file is not a JSON object");
        }
        String model = string(top, "model", "", false);
        Target shadow = target(top, "shadow");
        Target canary = target(top, "canary");
        Path log = Paths.get(string(top, "log", "", false));
        if (!log.isAbsolute()) {
            throw new Invalid("\"log\" must be an absolute path, not \"" + log + "\"");
        }
        String tokenFile = string(top, "token_file", "", true);
        if (tokenFile == null) {
            return new Routes(model, shadow, canary, log, null, null);
        }
        Path path = Paths.get(tokenFile);
        return new Routes(model, shadow, canary, log, path, firstLine(path));
    }

    static String firstLine(Path tokenFile) throws Invalid {
        String text;
        try {
            text = Files.readString(tokenFile, StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new Invalid("\"token_file\" " + tokenFile + " cannot be read (" + e + ")");
        }
        String line = text.lines().findFirst().orElse("").strip();
        if (line.isEmpty()) {
            throw new Invalid("\"token_file\" " + tokenFile + " has an empty first line");
        }
        return line;
    }

    private static Target target(Map<?, ?> top, String name) throws Invalid {
        Object value = top.get(name);
        if (value == null) {
            return null;
        }
        if (!(value instanceof Map<?, ?> t)) {
            throw new Invalid("\"" + name + "\" must be an object or null");
        }
        String where = name + ".";
        String version = string(t, "version", where, false);
        if (!(t.get("percent") instanceof Double percent)) {
            throw new Invalid("\"" + where + "percent\" must be a number from 0 to 100");
        }
        if (!(percent >= 0 && percent <= 100)) {
            throw new Invalid("\"" + where + "percent\" must be from 0 to 100, not " + percent);
        }
        String url = string(t, "url", where, false);
        URI uri;
        try {
            uri = new URI(url);
        } catch (java.net.URISyntaxException e) {
            throw new Invalid("\"" + where + "url\" is not a URL: " + e.getMessage());
        }
        if (!Set.of("http", "https").contains(String.valueOf(uri.getScheme()).toLowerCase(Locale.ROOT))
                || uri.getHost() == null) {
            throw new Invalid("\"" + where + "url\" must be http(s)://HOST[:PORT]/..., not \"" + url + "\"");
        }
        String keyHeader = name.equals("canary") ? string(t, "key_header", where, true) : null;
        return new Target(version, percent, uri, keyHeader);
    }

    private static String string(Map<?, ?> map, String key, String where, boolean nullable) throws Invalid {
        Object value = map.get(key);
        if (value == null && nullable) {
            return null;
        }
        if (!(value instanceof String s) || s.isBlank()) {
            throw new Invalid("\"" + where + key + "\" must be a non-empty string"
                    + (nullable ? " or null" : "") + (map.containsKey(key) ? "" : " (missing)"));
        }
        return s;
    }

    /** Whether the request with sticky key {@code key} goes to the canary. */
    boolean inCanary(String key) {
        return canary != null && canary.percent() > 0 && bucket(key) < canary.percent();
    }

    /** Whether a request goes to the shadow too, given its {@link #draw} in [0, 1). */
    boolean inShadow(double draw) {
        return shadow != null && draw * 100 < shadow.percent();
    }

    /**
     * The shadow's draw for the {@code n}th request: {@code start + n * (golden ratio - 1)}
     * modulo 1 (a Weyl sequence). With {@code start} uniform at random, each request is copied
     * with probability {@code percent}; and unlike independent draws, any run of consecutive
     * requests is copied within a few requests of {@code percent} of them.
     */
    static double draw(double start, long n) {
        double x = start + (n & 0xffffffffL) * 0.6180339887498949;
        return x - Math.floor(x);
    }

    /** The key's place in [0, 100): see the class comment. */
    static double bucket(String key) {
        byte[] digest;
        try {
            digest = MessageDigest.getInstance("SHA-256").digest(key.getBytes(StandardCharsets.UTF_8));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);  // every JDK has SHA-256
        }
        long high = 0;
        for (int i = 0; i < 8; i++) {
            high = (high << 8) | (digest[i] & 0xff);
        }
        // unsigned high / 2^64 * 100, exact enough in double
        return ((high >>> 11) * 0x1.0p-53) * 100;
    }

    String describe() {
        return "model " + model + ", shadow " + (shadow == null ? "none" : shadow.describe())
                + ", canary " + (canary == null ? "none" : canary.describe()) + ", log " + log
                + (tokenFile == null ? "" : ", token from " + tokenFile);
    }

    /** See the class comment. */
    public static void main(String[] args) throws IOException {
        if (args.length >= 1 && args[0].equals("--bucket")) {
            for (String key : List.of(args).subList(1, args.length)) {
                System.out.println(String.format(Locale.ROOT, "%.6f", bucket(key)));
            }
            return;
        }
        if (args.length == 0) {
            System.err.println("usage: Routes FILE... | --bucket KEY...");
            System.exit(2);
        }
        int invalid = 0;
        for (String file : args) {
            try {
                System.out.println(file + ": " + parse(Files.readString(Paths.get(file), StandardCharsets.UTF_8)).describe());
            } catch (Invalid e) {
                System.out.println(file + ": invalid: " + e.getMessage());
                invalid++;
            }
        }
        System.exit(invalid == 0 ? 0 : 1);
    }
}
