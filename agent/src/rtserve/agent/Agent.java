package rtserve.agent;

import java.lang.instrument.Instrumentation;
import java.net.URI;
import java.nio.file.InvalidPathException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * rtserve's Java agent for TorchServe 0.12.0's frontend: greedy batching, the Open Inference
 * Protocol's model metadata and readiness routes, and live routes (shadow and canary).
 *
 * <p>Loaded with {@code -javaagent:rtserve-agent.jar=<options>} (rtserve.server adds it to the
 * frontend's {@code vmargs}). Each feature is one {@link PinnedPatch} of one frontend class:
 *
 * <ul>
 *   <li>greedy batching ({@code org.pytorch.serve.wlm.Model.pollBatch}): the timed
 *       {@code poll(maxDelay, MILLISECONDS)} for the second and later jobs of a batch becomes
 *       {@link Greedy#poll}, which takes a job only if one is already queued, and the read of
 *       {@code maxBatchDelay} that seeds the loop's time budget becomes {@link Greedy#batchDelay},
 *       so the budget never runs out before {@code batchSize};
 *   <li>OIP model routes ({@code InferenceRequestHandler.handleRequest}): the call that passes a
 *       request the handler does not route on down the handler chain becomes
 *       {@link ModelRoutes#next}, which sends {@code GET /v2/models/...} to rtserve's answers
 *       (rtserve/server/oip.py) on loopback. Token authorization has run by then.
 *   <li>live routes ({@code org.pytorch.serve.util.ApiUtils.addRESTInferenceJob}, where every REST
 *       prediction's job is queued): the call {@code ModelManager.addJob(job)} becomes
 *       {@link Router#addJob}, which mirrors a share of {@code POST /predictions/{model}} to a
 *       candidate version (shadow) or sends a sticky share to it instead (canary), as the routes
 *       file says ({@link Routes}), and logs each copy's answer ({@link LiveLog}). Token
 *       authorization and the inference handler's checks have run by then.
 * </ul>
 *
 * <p>Options, comma-separated: {@code greedy=off} (no greedy batching), {@code oip=<url>} (where
 * rtserve.server.oip listens; without it the model routes stay TorchServe's 404),
 * {@code routes=<file>} (the live routes file, followed while the frontend runs; rtserve.server
 * passes {@code RUN_DIR/live-routes.json}; {@code routes=off} or no option: no live routes patch),
 * {@code live-log-bytes=<n>} (the live log and its one backup stay within n bytes: rtserve.server
 * passes the live log's share of its disk budget; without it, no cap),
 * {@code sha256=<hex>} (replaces Model's pinned checksum: tests), {@code sha256.<Class>=<hex>}
 * (replaces the pinned checksum of {@code Model}, {@code InferenceRequestHandler} or
 * {@code ApiUtils}: tests).
 */
public final class Agent {
    static final String MODEL = "org/pytorch/serve/wlm/Model";
    /** SHA-256 of Model.class in TorchServe 0.12.0's model-server.jar. */
    static final String MODEL_SHA256 =
            "7c5523f1fe77fe79aa32665469e17725e70518692abcf4987989ef72f10d4cff";
    static final String INFERENCE_HANDLER = "org/pytorch/serve/http/api/rest/InferenceRequestHandler";
    /** SHA-256 of InferenceRequestHandler.class in TorchServe 0.12.0's model-server.jar. */
    static final String INFERENCE_HANDLER_SHA256 =
            "915ac25d1f8a2360181528aa8eabd3c769ebd807d54798f0bce9bc934213eb93";
    static final String CHAIN = "org/pytorch/serve/http/HttpRequestHandlerChain";
    static final String API_UTILS = "org/pytorch/serve/util/ApiUtils";
    /** SHA-256 of ApiUtils.class in TorchServe 0.12.0's model-server.jar. */
    static final String API_UTILS_SHA256 =
            "c98900b13f1e13722cbdb97d76d83db7671476a5e1e69ad57270b519b6bd86d0";
    static final String HANDLE_REQUEST_DESC = "(Lio/netty/channel/ChannelHandlerContext;"
            + "Lio/netty/handler/codec/http/FullHttpRequest;"
            + "Lio/netty/handler/codec/http/QueryStringDecoder;[Ljava/lang/String;)V";

    private Agent() {
    }

    /** Agent entry point; {@code args}: see the class comment. */
    public static void premain(String args, Instrumentation inst) {
        Map<String, String> pins = new HashMap<>(Map.of(MODEL, MODEL_SHA256,
                INFERENCE_HANDLER, INFERENCE_HANDLER_SHA256, API_UTILS, API_UTILS_SHA256));
        boolean greedy = true;
        String oip = null;
        String routes = null;
        if (args != null) {
            for (String part : args.split(",")) {
                if (part.startsWith("sha256=")) {
                    pins.put(MODEL, part.substring("sha256=".length()).trim().toLowerCase());
                } else if (part.startsWith("sha256.") && part.contains("=")) {
                    String simple = part.substring("sha256.".length(), part.indexOf('='));
                    String target = pins.keySet().stream().filter(c -> c.endsWith("/" + simple))
                            .findFirst().orElse(null);
                    if (target == null) {
                        log("ignoring agent option '" + part + "': no patch of a class " + simple);
                    } else {
                        pins.put(target, part.substring(part.indexOf('=') + 1).trim().toLowerCase());
                    }
                } else if (part.equals("greedy=off")) {
                    greedy = false;
                } else if (part.startsWith("oip=")) {
                    oip = part.substring("oip=".length()).trim();
                } else if (part.startsWith("routes=")) {
                    routes = part.substring("routes=".length()).trim();
                } else if (part.startsWith("live-log-bytes=")) {
                    String value = part.substring("live-log-bytes=".length()).trim();
                    try {
                        LiveLog.cap(Long.parseLong(value));
                    } catch (NumberFormatException e) {
                        log("live log without a cap: live-log-bytes=" + value + " is not a number of bytes");
                    }
                } else if (!part.isBlank()) {
                    log("ignoring unknown agent option '" + part + "'");
                }
            }
        }
        if (greedy) {
            inst.addTransformer(greedyBatching(pins.get(MODEL)));
        }
        if (oip != null) {
            try {
                ModelRoutes.answeredBy(URI.create(oip));
                inst.addTransformer(modelRoutes(oip, pins.get(INFERENCE_HANDLER)));
            } catch (IllegalArgumentException e) {
                log("OIP model routes OFF: oip=" + oip + " is not a URL (" + e.getMessage() + ")");
            }
        }
        if (routes != null && !routes.equals("off")) {
            try {
                Path file = Paths.get(routes);
                if (!file.isAbsolute()) {
                    throw new InvalidPathException(routes, "not an absolute path");
                }
                inst.addTransformer(liveRoutes(file, pins.get(API_UTILS)).onPatched(() -> Router.watch(file)));
            } catch (InvalidPathException e) {
                log("live routes OFF: routes=" + routes + " is not a file's path (" + e.getMessage() + ")");
            }
        }
    }

    static PinnedPatch greedyBatching(String expected) {
        String helper = "rtserve/agent/Greedy";
        return new PinnedPatch("greedy batching", MODEL, expected, "pollBatch",
                "(Ljava/lang/String;JLjava/util/Map;)V", helper, List.of(
                        // Offsets in pollBatch's code: javap -c of the pinned class.
                        new PinnedPatch.Swap(131, PinnedPatch.GETFIELD, MODEL, "maxBatchDelay", "I",
                                "batchDelay", "(Ljava/lang/Object;)I"),
                        new PinnedPatch.Swap(261, PinnedPatch.INVOKEVIRTUAL,
                                "java/util/concurrent/LinkedBlockingDeque", "poll",
                                "(JLjava/util/concurrent/TimeUnit;)Ljava/lang/Object;", "poll",
                                "(Ljava/util/concurrent/LinkedBlockingDeque;JLjava/util/concurrent/TimeUnit;)"
                                        + "Ljava/lang/Object;")),
                "no wait for further jobs of a batch", "TorchServe runs stock");
    }

    static PinnedPatch modelRoutes(String oip, String expected) {
        return new PinnedPatch("OIP model routes", INFERENCE_HANDLER, expected,
                "handleRequest", HANDLE_REQUEST_DESC, "rtserve/agent/ModelRoutes", List.of(
                        // The last instruction but one of handleRequest: chain.handleRequest(...).
                        new PinnedPatch.Swap(409, PinnedPatch.INVOKEVIRTUAL, CHAIN, "handleRequest",
                                HANDLE_REQUEST_DESC, "next", "(Ljava/lang/Object;Ljava/lang/Object;"
                                        + "Ljava/lang/Object;Ljava/lang/Object;[Ljava/lang/String;)V")),
                "GET /v2/models/{name}[/versions/{version}][/ready] answered by rtserve.server.oip on " + oip,
                "those routes answer TorchServe's 404");
    }

    static PinnedPatch liveRoutes(Path file, String expected) {
        return new PinnedPatch("live routes", API_UTILS, expected, "addRESTInferenceJob",
                "(Lio/netty/channel/ChannelHandlerContext;Ljava/lang/String;Ljava/lang/String;"
                        + "Lorg/pytorch/serve/util/messages/RequestInput;)Lorg/pytorch/serve/job/RestJob;",
                "rtserve/agent/Router", List.of(
                        // ModelManager.getInstance().addJob(job): javap -c of the pinned class.
                        new PinnedPatch.Swap(21, PinnedPatch.INVOKEVIRTUAL, "org/pytorch/serve/wlm/ModelManager",
                                "addJob", "(Lorg/pytorch/serve/job/Job;)Z", "addJob",
                                "(Ljava/lang/Object;Ljava/lang/Object;)Z")),
                "POST /predictions/{model} shadowed or split as " + file + " says",
                "every prediction is queued as usual (no shadow or canary)");
    }

    static void log(String message) {
        System.err.println("[rtserve-agent] " + message);
        System.err.flush();
    }
}
