package rtserve.agent;

import java.lang.instrument.Instrumentation;
import java.net.URI;
import java.util.List;

/**
 * rtserve's Java agent for TorchServe 0.12.0's frontend: greedy batching and the Open Inference
 * Protocol's model metadata and readiness routes.
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
 *       (rtserve/oip.py) on loopback. Token authorization has run by then.
 * </ul>
 *
 * <p>Options, comma-separated: {@code greedy=off} (no greedy batching), {@code oip=<url>} (where
 * rtserve.oip listens; without it the model routes stay TorchServe's 404), {@code sha256=<hex>}
 * (replaces Model's pinned checksum: tests).
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
    static final String HANDLE_REQUEST_DESC = "(Lio/netty/channel/ChannelHandlerContext;"
            + "Lio/netty/handler/codec/http/FullHttpRequest;"
            + "Lio/netty/handler/codec/http/QueryStringDecoder;[Ljava/lang/String;)V";

    private Agent() {
    }

    /** Agent entry point; {@code args}: see the class comment. */
    public static void premain(String args, Instrumentation inst) {
        String modelSha = MODEL_SHA256;
        boolean greedy = true;
        String oip = null;
        if (args != null) {
            for (String part : args.split(",")) {
                if (part.startsWith("sha256=")) {
                    modelSha = part.substring("sha256=".length()).trim().toLowerCase();
                } else if (part.equals("greedy=off")) {
                    greedy = false;
                } else if (part.startsWith("oip=")) {
                    oip = part.substring("oip=".length()).trim();
                } else if (!part.isBlank()) {
                    log("ignoring unknown agent option '" + part + "'");
                }
            }
        }
        if (greedy) {
            inst.addTransformer(greedyBatching(modelSha));
        }
        if (oip != null) {
            try {
                ModelRoutes.answeredBy(URI.create(oip));
                inst.addTransformer(modelRoutes(oip));
            } catch (IllegalArgumentException e) {
                log("OIP model routes OFF: oip=" + oip + " is not a URL (" + e.getMessage() + ")");
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

    static PinnedPatch modelRoutes(String oip) {
        return new PinnedPatch("OIP model routes", INFERENCE_HANDLER, INFERENCE_HANDLER_SHA256,
                "handleRequest", HANDLE_REQUEST_DESC, "rtserve/agent/ModelRoutes", List.of(
                        // The last instruction but one of handleRequest: chain.handleRequest(...).
                        new PinnedPatch.Swap(409, PinnedPatch.INVOKEVIRTUAL, CHAIN, "handleRequest",
                                HANDLE_REQUEST_DESC, "next", "(Ljava/lang/Object;Ljava/lang/Object;"
                                        + "Ljava/lang/Object;Ljava/lang/Object;[Ljava/lang/String;)V")),
                "GET /v2/models/{name}[/versions/{version}][/ready] answered by rtserve.oip on " + oip,
                "those routes answer TorchServe's 404");
    }

    static void log(String message) {
        System.err.println("[rtserve-agent] " + message);
        System.err.flush();
    }
}
