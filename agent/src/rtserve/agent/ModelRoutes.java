package rtserve.agent;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;

/**
 * What the patched {@code InferenceRequestHandler.handleRequest} calls instead of passing a request
 * it does not route on down the handler chain (see {@link Agent}).
 *
 * <p>TorchServe 0.12's REST frontend has no route for the Open Inference Protocol's model metadata
 * ({@code GET /v2/models/{name}[/versions/{version}]}) and model readiness ({@code .../ready}). A
 * {@code GET} of a path under {@code /v2/models/} that reaches this point (inference and explain
 * requests never do) is sent to rtserve's own answers (rtserve/server/oip.py, on loopback), whose status
 * and JSON body go back to the client as TorchServe sends its own answers (access log, metrics,
 * headers); every other request goes down the chain as before. The frontend checked the token
 * first: its {@code TokenAuthorizationHandler} precedes the inference handler.
 *
 * <p>The frontend's classes (Netty's included) are reached through method handles resolved once
 * from the patched class's loader, so the agent builds with the JDK alone.
 */
public final class ModelRoutes {
    static final Duration TIMEOUT = Duration.ofSeconds(10);
    static final byte[] UNAVAILABLE = ("{\"error\": \"the model metadata and readiness routes "
            + "(rtserve.server.oip) are not answering\"}\n").getBytes(StandardCharsets.UTF_8);

    private static volatile URI upstream;
    private static volatile Frontend frontend;

    private ModelRoutes() {
    }

    /** Where rtserve.server.oip listens ({@code http://127.0.0.1:PORT}). */
    static void answeredBy(URI url) {
        if (!"http".equals(url.getScheme()) || url.getHost() == null || url.getPort() < 0) {
            throw new IllegalArgumentException("want http://HOST:PORT");
        }
        upstream = url;
    }

    /** Replaces {@code chain.handleRequest(ctx, req, decoder, segments)}. */
    public static void next(Object chain, Object ctx, Object req, Object decoder, String[] segments)
            throws Throwable {
        Frontend f = Frontend.of(chain.getClass().getClassLoader());
        if (upstream != null && segments.length >= 4 && "v2".equals(segments[1])
                && "models".equals(segments[2]) && "GET".equals(f.method(req))) {
            forward(f, ctx, path(segments));
            return;
        }
        f.handleRequest.invoke(chain, ctx, req, decoder, segments);
    }

    /** The decoded path segments, each percent-encoded again: a path of upstream's own. */
    static String path(String[] segments) {
        StringBuilder out = new StringBuilder();
        for (int i = 1; i < segments.length; i++) {
            out.append('/');
            for (byte b : segments[i].getBytes(StandardCharsets.UTF_8)) {
                char c = (char) (b & 0xff);
                if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                        || c == '-' || c == '.' || c == '_' || c == '~') {
                    out.append(c);
                } else {
                    out.append(String.format("%%%02X", b & 0xff));
                }
            }
        }
        return out.toString();
    }

    static void forward(Frontend f, Object ctx, String path) {
        HttpRequest request = HttpRequest.newBuilder(URI.create(upstream + path))
                .timeout(TIMEOUT).GET().build();
        Client.INSTANCE.sendAsync(request, HttpResponse.BodyHandlers.ofByteArray())
                .whenComplete((response, error) -> {
                    try {
                        if (error == null) {
                            f.send(ctx, response.statusCode(), response.body());
                        } else {
                            Agent.log("OIP model routes: " + upstream + path + " did not answer: " + error);
                            f.send(ctx, 503, UNAVAILABLE);
                        }
                    } catch (Throwable e) {
                        Agent.log("OIP model routes: cannot answer " + path + ": " + e);
                    }
                });
    }

    /** The HTTP client, made on first use (its threads too). */
    static final class Client {
        static final HttpClient INSTANCE = build();

        /** A new client as the agent's copies and forwards use it: HTTP/1.1, keep-alive. */
        static HttpClient build() {
            return HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(TIMEOUT).build();
        }

        private Client() {
        }
    }

    /** Method handles on the frontend's classes (public members only). */
    static final class Frontend {
        final MethodHandle handleRequest;
        final MethodHandle method;
        final MethodHandle status;
        final MethodHandle wrap;
        final MethodHandle response;
        final MethodHandle headers;
        final MethodHandle setHeader;
        final MethodHandle sendHttpResponse;
        final Object http11;

        static Frontend of(ClassLoader loader) throws ReflectiveOperationException {
            Frontend f = frontend;
            if (f == null) {
                f = new Frontend(loader);
                frontend = f;
            }
            return f;
        }

        private Frontend(ClassLoader loader) throws ReflectiveOperationException {
            MethodHandles.Lookup lookup = MethodHandles.publicLookup();
            Class<?> ctx = load(loader, "io.netty.channel.ChannelHandlerContext");
            Class<?> request = load(loader, "io.netty.handler.codec.http.HttpRequest");
            Class<?> fullRequest = load(loader, "io.netty.handler.codec.http.FullHttpRequest");
            Class<?> decoder = load(loader, "io.netty.handler.codec.http.QueryStringDecoder");
            Class<?> httpMethod = load(loader, "io.netty.handler.codec.http.HttpMethod");
            Class<?> version = load(loader, "io.netty.handler.codec.http.HttpVersion");
            Class<?> responseStatus = load(loader, "io.netty.handler.codec.http.HttpResponseStatus");
            Class<?> byteBuf = load(loader, "io.netty.buffer.ByteBuf");
            Class<?> message = load(loader, "io.netty.handler.codec.http.HttpMessage");
            Class<?> httpHeaders = load(loader, "io.netty.handler.codec.http.HttpHeaders");
            Class<?> httpResponse = load(loader, "io.netty.handler.codec.http.HttpResponse");
            handleRequest = lookup.findVirtual(load(loader, CHAIN), "handleRequest",
                    MethodType.methodType(void.class, ctx, fullRequest, decoder, String[].class));
            method = lookup.findVirtual(request, "method", MethodType.methodType(httpMethod));
            status = lookup.findStatic(responseStatus, "valueOf",
                    MethodType.methodType(responseStatus, int.class));
            wrap = lookup.findStatic(load(loader, "io.netty.buffer.Unpooled"), "wrappedBuffer",
                    MethodType.methodType(byteBuf, byte[].class));
            response = lookup.findConstructor(
                    load(loader, "io.netty.handler.codec.http.DefaultFullHttpResponse"),
                    MethodType.methodType(void.class, version, responseStatus, byteBuf));
            headers = lookup.findVirtual(message, "headers", MethodType.methodType(httpHeaders));
            setHeader = lookup.findVirtual(httpHeaders, "set",
                    MethodType.methodType(httpHeaders, String.class, Object.class));
            sendHttpResponse = lookup.findStatic(load(loader, "org.pytorch.serve.util.NettyUtils"),
                    "sendHttpResponse", MethodType.methodType(void.class, ctx, httpResponse, boolean.class));
            http11 = version.getField("HTTP_1_1").get(null);
        }

        static final String CHAIN = "org.pytorch.serve.http.HttpRequestHandlerChain";

        static Class<?> load(ClassLoader loader, String name) throws ClassNotFoundException {
            return Class.forName(name, false, loader);
        }

        String method(Object req) throws Throwable {
            return String.valueOf(method.invoke(req));
        }

        /** A JSON answer, sent as TorchServe sends its own (NettyUtils.sendHttpResponse). */
        void send(Object ctx, int code, byte[] body) throws Throwable {
            send(ctx, code, body, Map.of("Content-Type", "application/json"));
        }

        /** An answer with {@code fields} as headers, sent as TorchServe sends its own. */
        void send(Object ctx, int code, byte[] body, Map<String, String> fields) throws Throwable {
            Object answer = response.invoke(http11, status.invoke(code), wrap.invoke(body));
            Object answerHeaders = headers.invoke(answer);
            for (Map.Entry<String, String> field : fields.entrySet()) {
                setHeader.invoke(answerHeaders, field.getKey(), field.getValue());
            }
            sendHttpResponse.invoke(ctx, answer, true);
        }
    }
}
