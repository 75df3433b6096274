package rtserve.agent;

import java.io.IOException;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

/**
 * What the patched {@code ApiUtils.addRESTInferenceJob} calls instead of
 * {@code ModelManager.addJob(job)}: the live routes (shadow and canary) of one model (see
 * {@link Agent}).
 *
 * <p>A daemon thread reads the routes file ({@link Routes}) when its modification time, size or
 * inode changes (checked every 200 ms); a missing file is no routes, an invalid one leaves the
 * previous routes and says why on stderr. With no routes, a job costs one volatile read more
 * than TorchServe's own call.
 *
 * <p>Only {@code POST /predictions/{model}} with no version in the path, for the routes' model
 * and with a body that is not a multipart form, is routed; every other job (explicit versions,
 * explanations, KServe, invocations) is queued as before, and so is a readiness probe's
 * prediction ({@code X-Rtserve-Route: probe}): it checks this pod, and is not traffic to compare.
 *
 * <ul>
 *   <li>canary (first): a request whose sticky key ({@code key_header}'s value, else the client's
 *       address) falls in the share is sent to {@code canary.url} instead; its status, body,
 *       {@code Content-Type}, {@code x-request-id}, {@code Retry-After} and {@code x-*} headers go back
 *       to the caller as TorchServe sends its answers. A candidate that gives no answer
 *       (refused, 10 s without one) leaves the request to the default (its job is queued then).
 *   <li>shadow: otherwise the job is queued, and a {@code percent} share of the requests is also
 *       sent to {@code shadow.url} (chosen as {@link Routes#draw} says: at random, and close to
 *       the share over any run of requests), with {@code x-rtserve-shadow-of: <job id>}; nobody waits on it,
 *       at most {@value #MAX_MIRRORS} are in flight (more are dropped and logged as such).
 * </ul>
 * Each copy carries the request's body and {@code Content-Type}, its query string, and its
 * {@code Authorization} header, or {@code Bearer <token>} when the routes name a token file.
 * Every copy's outcome is a line of the live log ({@link LiveLog}).
 *
 * <p>The other half is Python's, in rtserve/promotion/live/: routes.py writes the routes file (and
 * holds the sticky bucket's one Python definition), watcher.py aborts a canary by setting its share
 * to 0, local.py and cluster.py are what the live commands do.
 */
public final class Router {
    static final int MAX_MIRRORS = 64;
    static final long CHECK_MS = 200;
    static final String SHADOW_OF = "x-rtserve-shadow-of";
    /** The header naming a request's route in its record, and the readiness probe's route. */
    static final String ROUTE_HEADER = "X-Rtserve-Route";
    static final String PROBE_ROUTE = "probe";

    private static volatile Routes routes;
    /**
     * {@code ModelManager.addJob}, typed (Object, Object) boolean; made on first use. Not
     * volatile: a method handle is immutable (final fields), so a thread that sees null makes an
     * equal one (the racy single-check idiom) and the hot path reads one volatile field only.
     */
    private static MethodHandle addJob;
    private static volatile Jobs jobs;
    private static volatile boolean broken;
    private static final Semaphore MIRRORS = new Semaphore(MAX_MIRRORS);
    /** The shadow's draws: {@link Routes#draw} from a random start, one per routed request. */
    private static final double START = ThreadLocalRandom.current().nextDouble();
    private static final AtomicLong DRAWS = new AtomicLong();

    private Router() {
    }

    /** Replaces {@code ModelManager.getInstance().addJob(job)} in {@code addRESTInferenceJob}. */
    public static boolean addJob(Object manager, Object job) throws Throwable {
        Routes r = routes;
        MethodHandle add = addJob;
        if (add == null) {
            add = addJobOf(manager.getClass());
            addJob = add;
        }
        if (r == null) {
            return (boolean) add.invokeExact(manager, job);
        }
        return route(r, add, manager, job);
    }

    static MethodHandle addJobOf(Class<?> manager) throws ReflectiveOperationException {
        Class<?> job = Class.forName("org.pytorch.serve.job.Job", false, manager.getClassLoader());
        return MethodHandles.publicLookup()
                .findVirtual(manager, "addJob", MethodType.methodType(boolean.class, job))
                .asType(MethodType.methodType(boolean.class, Object.class, Object.class));
    }

    /** Routes one job; it is queued (here, or later by a canary that got no answer) at most once. */
    private static boolean route(Routes r, MethodHandle add, Object manager, Object job) throws Throwable {
        Jobs j = null;
        Request req = null;
        try {
            j = Jobs.of(manager);
            req = Request.of(r, j, job);
        } catch (Throwable e) {  // a frontend other than the one these handles were made for
            if (!broken) {
                broken = true;
                Agent.log("live routes: cannot read requests, each is queued as usual (" + e + ")");
            }
        }
        if (req == null) {
            return (boolean) add.invokeExact(manager, job);
        }
        if (r.canary != null && r.inCanary(req.key)) {
            return forward(r, j, add, manager, job, req);
        }
        boolean queued = (boolean) add.invokeExact(manager, job);
        if (queued && r.inShadow(Routes.draw(START, DRAWS.getAndIncrement()))) {
            mirror(r, req);
        }
        return queued;
    }

    /** What a copy of one request needs, read on the caller's thread (the job is not shared yet). */
    static final class Request {
        final String id;
        final Object ctx;
        final Object session;
        final String query;
        final byte[] body;
        final String contentType;
        final String authorization;
        final String key;
        final long at = System.currentTimeMillis();

        private Request(String id, Object ctx, Object session, String query, byte[] body,
                        String contentType, String authorization, String key) {
            this.id = id;
            this.ctx = ctx;
            this.session = session;
            this.query = query;
            this.body = body;
            this.contentType = contentType;
            this.authorization = authorization;
            this.key = key;
        }

        /** The request behind {@code job} if the routes apply to it, else null. */
        static Request of(Routes r, Jobs j, Object job) throws Throwable {
            if (!j.restJob.isInstance(job) || !r.model.equals((String) j.modelName.invokeExact(job))
                    || (String) j.modelVersion.invokeExact(job) != null) {
                return null;
            }
            Object ctx = (Object) j.ctx.invokeExact(job);
            Object channel = ctx == null ? null : (Object) j.channel.invokeExact(ctx);
            Object session = channel == null ? null : j.session(channel);
            if (session == null || !"POST".equals((String) j.sessionMethod.invokeExact(session))) {
                return null;
            }
            String uri = (String) j.sessionUri.invokeExact(session);
            int q = uri.indexOf('?');
            String path = q < 0 ? uri : uri.substring(0, q);
            while (path.endsWith("/")) {
                path = path.substring(0, path.length() - 1);
            }
            // The model's own name matched and no version was given: only the path's kind is left.
            if (!path.startsWith("/predictions/") || path.indexOf('/', "/predictions/".length()) >= 0) {
                return null;
            }
            Object input = (Object) j.payload.invokeExact(job);
            byte[] body = null;
            for (Object parameter : (List<?>) j.parameters.invokeExact(input)) {
                if ("body".equals((String) j.parameterName.invokeExact(parameter))) {
                    body = (byte[]) j.parameterValue.invokeExact(parameter);
                }
            }
            if (body == null) {  // a multipart form (its fields were split) or no body at all
                return null;
            }
            @SuppressWarnings("unchecked")
            Map<String, String> headers = (Map<String, String>) j.headers.invokeExact(input);
            if (PROBE_ROUTE.equals(header(headers, ROUTE_HEADER))) {
                return null;
            }
            String key = null;
            if (r.canary != null) {
                key = r.canary.keyHeader() == null ? null : header(headers, r.canary.keyHeader());
                if (key == null) {
                    key = address((SocketAddress) j.remoteAddress.invokeExact(channel));
                }
            }
            return new Request((String) j.jobId.invokeExact(job), ctx, session,
                    q < 0 ? "" : uri.substring(q), body, header(headers, "Content-Type"),
                    header(headers, "Authorization"), key);
        }

        static String header(Map<String, String> headers, String name) {
            for (Map.Entry<String, String> e : headers.entrySet()) {
                if (e.getKey().equalsIgnoreCase(name)) {
                    return e.getValue();
                }
            }
            return null;
        }

        static String address(SocketAddress address) {
            if (address instanceof InetSocketAddress inet && inet.getAddress() != null) {
                return inet.getAddress().getHostAddress();
            }
            return String.valueOf(address);
        }
    }

    static HttpRequest copy(Routes r, Routes.Target target, Request req, boolean shadow) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(target.url() + req.query))
                .timeout(ModelRoutes.TIMEOUT)
                .POST(HttpRequest.BodyPublishers.ofByteArray(req.body));
        if (req.contentType != null) {
            b.header("Content-Type", req.contentType);
        }
        String authorization = r.token != null ? "Bearer " + r.token : req.authorization;
        if (authorization != null) {
            b.header("Authorization", authorization);
        }
        if (shadow) {
            b.header(SHADOW_OF, req.id);
        }
        return b.build();
    }

    static void mirror(Routes r, Request req) {
        Routes.Target shadow = r.shadow;
        if (!MIRRORS.tryAcquire()) {
            LiveLog.append(r.log, "shadow", req.id, "", shadow.version(), -1, 0, req.at, "",
                    "dropped: " + MAX_MIRRORS + " mirrors in flight");
            return;
        }
        long start = System.nanoTime();
        try {
            Clients.of(shadow.url()).sendAsync(copy(r, shadow, req, true),
                    HttpResponse.BodyHandlers.ofByteArray()).whenComplete((response, error) -> {
                        MIRRORS.release();
                        record(r, "shadow", shadow, req, start, response, error);
                    });
        } catch (RuntimeException e) {
            MIRRORS.release();
            record(r, "shadow", shadow, req, start, null, e);
        }
    }

    /**
     * Send the request to the canary; its answer, or without one the default's, goes to the
     * caller. Whether the job is (or will be) answered, as {@code addJob} says.
     */
    static boolean forward(Routes r, Jobs j, MethodHandle add, Object manager, Object job, Request req)
            throws Throwable {
        Routes.Target canary = r.canary;
        long start = System.nanoTime();
        try {
            Clients.of(canary.url()).sendAsync(copy(r, canary, req, false),
                    HttpResponse.BodyHandlers.ofByteArray()).whenComplete((response, error) -> {
                        record(r, "canary", canary, req, start, response, error);
                        try {
                            if (error == null) {
                                relay(j, req, response);
                            } else if (!(boolean) add.invokeExact(manager, job)) {
                                j.sendError.invokeExact(job, 503, "Model \"" + r.model
                                        + "\" has no worker to serve inference request. "
                                        + "Please use scale workers API to add workers.");
                            }
                        } catch (Throwable e) {
                            Agent.log("live routes: cannot answer request " + req.id + ": " + e);
                        }
                    });
            return true;
        } catch (RuntimeException e) {  // not sent at all: the default answers now
            record(r, "canary", canary, req, start, null, e);
            return (boolean) add.invokeExact(manager, job);
        }
    }

    /** The candidate's answer, sent to the caller as TorchServe sends its own. */
    static void relay(Jobs j, Request req, HttpResponse<byte[]> response) throws Throwable {
        Map<String, String> headers = new LinkedHashMap<>();  // lower-case names, as Netty's own
        response.headers().map().forEach((name, values) -> {
            String lower = name.toLowerCase(Locale.ROOT);
            if (!values.isEmpty() && (lower.equals("content-type") || lower.equals("retry-after")
                    || lower.startsWith("x-") && !lower.equals("x-request-id"))) {
                headers.put(lower, values.get(0));
            }
        });
        headers.putIfAbsent("content-type", "application/json");
        String id = response.headers().firstValue("x-request-id").orElse(null);
        if (id != null) {  // NettyUtils.sendHttpResponse answers with the session's id
            j.sessionRequestId.invokeExact(req.session, id);
        }
        ModelRoutes.Frontend.of(j.loader).send(req.ctx, response.statusCode(), response.body(), headers);
    }

    static void record(Routes r, String kind, Routes.Target target, Request req, long start,
                       HttpResponse<byte[]> response, Throwable error) {
        double ms = (System.nanoTime() - start) / 1e6;
        if (response != null) {
            LiveLog.append(r.log, kind, req.id, response.headers().firstValue("x-request-id").orElse(""),
                    target.version(), response.statusCode(), ms, req.at,
                    new String(response.body(), StandardCharsets.UTF_8), null);
        } else {
            Throwable cause = error instanceof CompletionException && error.getCause() != null
                    ? error.getCause() : error;
            LiveLog.append(r.log, kind, req.id, "", target.version(), 0, ms, req.at, "",
                    String.valueOf(cause));
        }
    }

    /**
     * One HTTP client per target scheme, host and port, as the routes name them. The JDK's client
     * pools connections by resolved address, so a target given an address an earlier one had (a
     * Service deleted and another made that gets its ClusterIP) would be sent the copies over the
     * connections still open to the earlier target's pods; a client of its own has none of them.
     * A host the routes no longer name loses its client (whose idle connections close once it is
     * collected).
     */
    static final class Clients {
        private static final Map<String, HttpClient> BY_HOST = new ConcurrentHashMap<>();

        private Clients() {
        }

        static HttpClient of(URI url) {
            return BY_HOST.computeIfAbsent(key(url), k -> ModelRoutes.Client.build());
        }

        /** Forget the clients of the hosts {@code r} does not name (all of them when it is null). */
        static void keep(Routes r) {
            Set<String> named = new HashSet<>();
            for (Routes.Target t : r == null ? new Routes.Target[0] : new Routes.Target[] {r.shadow, r.canary}) {
                if (t != null) {
                    named.add(key(t.url()));
                }
            }
            BY_HOST.keySet().retainAll(named);
        }

        static String key(URI url) {
            return url.getScheme().toLowerCase(Locale.ROOT) + "://" + url.getHost().toLowerCase(Locale.ROOT) + ":"
                    + url.getPort();
        }
    }

    /** Start the daemon thread that follows {@code file} (see the class comment). */
    static void watch(Path file) {
        Thread watcher = new Thread(() -> {
            Watch w = new Watch(file);
            while (true) {
                try {
                    w.check();
                    Thread.sleep(CHECK_MS);
                } catch (InterruptedException e) {
                    return;
                } catch (RuntimeException e) {
                    Agent.log("live routes: " + file + ": " + e);
                }
            }
        }, "rtserve-live-routes");
        watcher.setDaemon(true);
        watcher.start();
    }

    /** The routes file's last state seen, and what to do when it changes. */
    static final class Watch {
        final Path file;
        private String seen = "";
        private Path tokenFile;

        Watch(Path file) {
            this.file = file;
        }

        void check() {
            String now = stamp(file);
            if (now == null) {
                if (routes != null) {
                    Agent.log("live routes: " + file + " is gone: no routes");
                }
                routes = null;
                Clients.keep(null);
                seen = "";
                return;
            }
            if ((now + stamp(tokenFile)).equals(seen)) {
                return;
            }
            try {
                Routes r = Routes.parse(Files.readString(file, StandardCharsets.UTF_8));
                tokenFile = r.tokenFile;
                Clients.keep(r);
                routes = r;
                Agent.log("live routes: " + file + ": " + r.describe());
            } catch (Routes.Invalid | IOException | RuntimeException e) {
                Routes kept = routes;
                Agent.log("live routes: " + file + ": " + e.getMessage() + "; keeping the previous routes ("
                        + (kept == null ? "none" : kept.describe()) + ")");
            }
            seen = now + stamp(tokenFile);
        }

        /** Modification time, size and inode of {@code path}; null if it does not exist. */
        private static String stamp(Path path) {
            if (path == null) {
                return "";
            }
            try {
                BasicFileAttributes a = Files.readAttributes(path, BasicFileAttributes.class);
                return a.lastModifiedTime() + "/" + a.size() + "/" + a.fileKey() + ";";
            } catch (NoSuchFileException e) {
                return null;
            } catch (IOException e) {
                return e + ";";
            }
        }
    }

    /** Method handles on the frontend's job, request and channel classes. */
    static final class Jobs {
        final ClassLoader loader;
        final Class<?> restJob;
        final MethodHandle jobId;
        final MethodHandle modelName;
        final MethodHandle modelVersion;
        final MethodHandle payload;
        final MethodHandle sendError;
        final MethodHandle ctx;
        final MethodHandle channel;
        final MethodHandle remoteAddress;
        final MethodHandle attr;
        final MethodHandle attrGet;
        final Object sessionKey;
        final MethodHandle sessionMethod;
        final MethodHandle sessionUri;
        final MethodHandle sessionRequestId;
        final MethodHandle headers;
        final MethodHandle parameters;
        final MethodHandle parameterName;
        final MethodHandle parameterValue;

        static Jobs of(Object manager) throws Throwable {
            Jobs j = jobs;
            if (j == null) {
                j = new Jobs(manager.getClass().getClassLoader());
                LiveLog.limitBodies(j.loader);  // before the first line: none is appended without Jobs
                jobs = j;
            }
            return j;
        }

        private Jobs(ClassLoader loader) throws Throwable {
            this.loader = loader;
            MethodHandles.Lookup lookup = MethodHandles.publicLookup();
            Class<?> job = load("org.pytorch.serve.job.Job");
            restJob = load("org.pytorch.serve.job.RestJob");
            Class<?> input = load("org.pytorch.serve.util.messages.RequestInput");
            Class<?> parameter = load("org.pytorch.serve.util.messages.InputParameter");
            Class<?> context = load("io.netty.channel.ChannelHandlerContext");
            Class<?> channelClass = load("io.netty.channel.Channel");
            Class<?> attributeMap = load("io.netty.util.AttributeMap");
            Class<?> attributeKey = load("io.netty.util.AttributeKey");
            Class<?> attribute = load("io.netty.util.Attribute");
            Class<?> session = load("org.pytorch.serve.http.Session");
            Class<?> netty = load("org.pytorch.serve.util.NettyUtils");

            jobId = getter(lookup, job, "getJobId", String.class);
            modelName = getter(lookup, job, "getModelName", String.class);
            modelVersion = getter(lookup, job, "getModelVersion", String.class);
            payload = getter(lookup, job, "getPayload", input);
            sendError = lookup.findVirtual(job, "sendError",
                            MethodType.methodType(void.class, int.class, String.class))
                    .asType(MethodType.methodType(void.class, Object.class, int.class, String.class));
            channel = getter(lookup, context, "channel", channelClass);
            remoteAddress = getter(lookup, channelClass, "remoteAddress", SocketAddress.class);
            attr = lookup.findVirtual(attributeMap, "attr", MethodType.methodType(attribute, attributeKey));
            attrGet = lookup.findVirtual(attribute, "get", MethodType.methodType(Object.class));
            headers = getter(lookup, input, "getHeaders", Map.class);
            parameters = getter(lookup, input, "getParameters", List.class);
            parameterName = getter(lookup, parameter, "getName", String.class);
            parameterValue = getter(lookup, parameter, "getValue", byte[].class);

            // Private members: the agent and the frontend share the class path's unnamed module.
            MethodHandles.Lookup mine = MethodHandles.lookup();
            ctx = MethodHandles.privateLookupIn(restJob, mine).findGetter(restJob, "ctx", context)
                    .asType(MethodType.methodType(Object.class, Object.class));
            sessionKey = MethodHandles.privateLookupIn(netty, mine)
                    .findStaticGetter(netty, "SESSION_KEY", attributeKey).invoke();
            MethodHandles.Lookup inSession = MethodHandles.privateLookupIn(session, mine);
            sessionMethod = inSession.findGetter(session, "method", String.class)
                    .asType(MethodType.methodType(String.class, Object.class));
            sessionUri = inSession.findGetter(session, "uri", String.class)
                    .asType(MethodType.methodType(String.class, Object.class));
            sessionRequestId = inSession.findSetter(session, "requestId", String.class)
                    .asType(MethodType.methodType(void.class, Object.class, String.class));
        }

        private Class<?> load(String name) throws ClassNotFoundException {
            return ModelRoutes.Frontend.load(loader, name);
        }

        /**
         * {@code owner.name()}, typed {@code (Object) returns} for a JDK type and
         * {@code (Object) Object} for a frontend one.
         */
        private static MethodHandle getter(MethodHandles.Lookup lookup, Class<?> owner, String name,
                                           Class<?> returns) throws ReflectiveOperationException {
            MethodHandle h = lookup.findVirtual(owner, name, MethodType.methodType(returns));
            Class<?> as = returns.getClassLoader() == null ? returns : Object.class;
            return h.asType(MethodType.methodType(as, Object.class));
        }

        Object session(Object channel) throws Throwable {
            return attrGet.invoke(attr.invoke(channel, sessionKey));
        }

        @Override
        public String toString() {
            return "Jobs(" + Objects.toString(loader) + ")";
        }
    }
}
