package rtserve.agent;

import java.util.concurrent.LinkedBlockingDeque;
import java.util.concurrent.TimeUnit;

/**
 * What the patched batch aggregator calls instead of its timed waits (see {@link Agent}).
 *
 * <p>TorchServe 0.12's {@code Model.pollBatch} blocks for the first job of a batch, then waits up to
 * {@code maxBatchDelay} for each further one. Patched, it still blocks for the first job, but
 * takes only what is already queued for the rest: a batch is whatever waits when a worker
 * becomes free (up to {@code batchSize}), never a batch that waited for more.
 */
public final class Greedy {
    private Greedy() {
    }

    /** Replaces {@code queue.poll(timeout, unit)} for the second and later jobs of a batch. */
    public static Object poll(LinkedBlockingDeque<?> queue, long timeout, TimeUnit unit) {
        return queue.poll();
    }

    /**
     * Replaces the read of {@code Model.maxBatchDelay} in {@code pollBatch}: the loop's time
     * budget never runs out, so only {@code batchSize} and an empty queue end a batch.
     */
    public static int batchDelay(Object model) {
        return Integer.MAX_VALUE;
    }
}
