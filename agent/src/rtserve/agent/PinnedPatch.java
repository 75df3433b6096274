package rtserve.agent;

import java.io.ByteArrayOutputStream;
import java.lang.instrument.ClassFileTransformer;
import java.lang.instrument.Instrumentation;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.ProtectionDomain;

/**
 * rtserve's Java agent for TorchServe 0.12.0's frontend: greedy batching.
 *
 * <p>Loaded with {@code -javaagent:rtserve-agent.jar} (rtserve.server adds it to the frontend's
 * {@code vmargs} unless {@code rtserve_greedy_batching=false}). It changes two instructions of
 * one method, {@code org.pytorch.serve.wlm.Model.pollBatch(String, long, Map)}, and nothing else:
 *
 * <ul>
 *   <li>the timed {@code poll(maxDelay, MILLISECONDS)} for the second and later jobs of a batch
 *       becomes {@link Greedy#poll}, which takes a job only if one is already queued;
 *   <li>the read of {@code maxBatchDelay} that seeds the loop's time budget becomes
 *       {@link Greedy#batchDelay}, so the budget never runs out before {@code batchSize}.
 * </ul>
 *
 * <p>Both replacements are the same length as the instructions they replace and leave the
 * operand stack as it was, so no offset, branch or stack map changes. Before patching, the
 * agent checks that the class is exactly the one it was written against (its SHA-256) and that
 * the two instructions are where that class has them; otherwise it leaves TorchServe stock and
 * says why on the frontend's stderr. The JDK's own {@code java.lang.instrument} API is all it
 * uses.
 */
public final class GreedyBatching implements ClassFileTransformer {
    static final String TARGET = "org/pytorch/serve/wlm/Model";
    static final String METHOD = "pollBatch";
    static final String METHOD_DESC = "(Ljava/lang/String;JLjava/util/Map;)V";
    /** SHA-256 of Model.class in TorchServe 0.12.0's model-server.jar. */
    static final String PINNED_SHA256 =
            "7c5523f1fe77fe79aa32665469e17725e70518692abcf4987989ef72f10d4cff";
    /** Offsets in pollBatch's code (javap -c of the pinned class). */
    static final int GETFIELD_MAX_BATCH_DELAY = 131;
    static final int INVOKE_TIMED_POLL = 261;

    static final String HELPER = "rtserve/agent/Greedy";
    static final String POLL_DESC =
            "(Ljava/util/concurrent/LinkedBlockingDeque;JLjava/util/concurrent/TimeUnit;)Ljava/lang/Object;";
    static final String DELAY_DESC = "(Ljava/lang/Object;)I";

    private static final int GETFIELD = 0xb4;
    private static final int INVOKEVIRTUAL = 0xb6;
    private static final int INVOKESTATIC = 0xb8;

    private final String expected;

    GreedyBatching(String expected) {
        this.expected = expected;
    }

    /** Agent entry point. {@code args}: {@code sha256=<hex>} replaces the pinned checksum (tests). */
    public static void premain(String args, Instrumentation inst) {
        String expected = PINNED_SHA256;
        if (args != null) {
            for (String part : args.split(",")) {
                if (part.startsWith("sha256=")) {
                    expected = part.substring("sha256=".length()).trim().toLowerCase();
                } else if (!part.isBlank()) {
                    log("ignoring unknown agent option '" + part + "'");
                }
            }
        }
        inst.addTransformer(new GreedyBatching(expected));
    }

    static void log(String message) {
        System.err.println("[rtserve-agent] " + message);
        System.err.flush();
    }

    @Override
    public byte[] transform(ClassLoader loader, String className, Class<?> redefined,
                            ProtectionDomain domain, byte[] classfile) {
        if (!TARGET.equals(className)) {
            return null;
        }
        try {
            String actual = sha256(classfile);
            if (!actual.equals(expected)) {
                log("greedy batching OFF: " + TARGET + ".class has SHA-256 " + actual
                        + ", not the pinned " + expected + " (not TorchServe 0.12.0's frontend);"
                        + " TorchServe runs stock");
                return null;
            }
            byte[] patched = patch(classfile);
            log("greedy batching ON: patched " + TARGET + "." + METHOD
                    + " (no wait for further jobs of a batch)");
            return patched;
        } catch (RuntimeException | NoSuchAlgorithmException e) {
            log("greedy batching OFF: " + e.getMessage() + "; TorchServe runs stock");
            return null;
        }
    }

    static String sha256(byte[] data) throws NoSuchAlgorithmException {
        StringBuilder hex = new StringBuilder();
        for (byte b : MessageDigest.getInstance("SHA-256").digest(data)) {
            hex.append(String.format("%02x", b));
        }
        return hex.toString();
    }

    /** The class with the two instructions replaced (see the class comment). */
    static byte[] patch(byte[] in) {
        ClassReader cls = new ClassReader(in);
        int code = cls.codeOf(METHOD, METHOD_DESC);
        int delayAt = code + GETFIELD_MAX_BATCH_DELAY;
        int pollAt = code + INVOKE_TIMED_POLL;
        cls.expect(delayAt, GETFIELD, "org/pytorch/serve/wlm/Model", "maxBatchDelay", "I");
        cls.expect(pollAt, INVOKEVIRTUAL, "java/util/concurrent/LinkedBlockingDeque", "poll",
                "(JLjava/util/concurrent/TimeUnit;)Ljava/lang/Object;");

        // New constant pool entries go after the existing ones: no existing index moves.
        ConstantPoolWriter pool = new ConstantPoolWriter(cls.count);
        int helper = pool.classRef(HELPER);
        int poll = pool.methodRef(helper, "poll", POLL_DESC);
        int delay = pool.methodRef(helper, "batchDelay", DELAY_DESC);

        byte[] extra = pool.bytes();
        byte[] out = new byte[in.length + extra.length];
        System.arraycopy(in, 0, out, 0, cls.poolEnd);
        System.arraycopy(extra, 0, out, cls.poolEnd, extra.length);
        System.arraycopy(in, cls.poolEnd, out, cls.poolEnd + extra.length, in.length - cls.poolEnd);
        putU2(out, 8, pool.next);
        int shift = extra.length;
        out[delayAt + shift] = (byte) INVOKESTATIC;
        putU2(out, delayAt + shift + 1, delay);
        out[pollAt + shift] = (byte) INVOKESTATIC;
        putU2(out, pollAt + shift + 1, poll);
        return out;
    }

    static void putU2(byte[] b, int at, int value) {
        b[at] = (byte) (value >>> 8);
        b[at + 1] = (byte) value;
    }

    /** Just enough of the class file format to find a method's code and read member references. */
    static final class ClassReader {
        final byte[] b;
        final int count;
        final int[] offsets;
        final int poolEnd;

        ClassReader(byte[] b) {
            this.b = b;
            if (u4(0) != 0xCAFEBABE) {
                throw new IllegalStateException("not a class file");
            }
            count = u2(8);
            offsets = new int[count];
            int pos = 10;
            for (int i = 1; i < count; i++) {
                offsets[i] = pos;
                int tag = u1(pos);
                switch (tag) {
                    case 1: pos += 3 + u2(pos + 1); break;                       // Utf8
                    case 3: case 4: case 9: case 10: case 11: case 12: case 17: case 18:
                        pos += 5; break;                                         // 4-byte entries
                    case 5: case 6: pos += 9; i++; break;                        // Long, Double
                    case 7: case 8: case 16: case 19: case 20: pos += 3; break;  // 2-byte entries
                    case 15: pos += 4; break;                                    // MethodHandle
                    default: throw new IllegalStateException("unknown constant pool tag " + tag);
                }
            }
            poolEnd = pos;
        }

        int u1(int at) {
            return b[at] & 0xff;
        }

        int u2(int at) {
            return (u1(at) << 8) | u1(at + 1);
        }

        int u4(int at) {
            return (u2(at) << 16) | u2(at + 2);
        }

        String utf8(int index) {
            int at = offsets[index];
            if (u1(at) != 1) {
                throw new IllegalStateException("constant " + index + " is not a Utf8");
            }
            return new String(b, at + 3, u2(at + 1), StandardCharsets.UTF_8);
        }

        /** Offset of the first instruction of method {@code name} {@code desc}. */
        int codeOf(String name, String desc) {
            int pos = poolEnd + 6;           // access_flags, this_class, super_class
            pos += 2 + 2 * u2(pos);          // interfaces
            pos = skipMembers(pos);          // fields
            int methods = u2(pos);
            pos += 2;
            for (int m = 0; m < methods; m++) {
                boolean match = utf8(u2(pos + 2)).equals(name) && utf8(u2(pos + 4)).equals(desc);
                int attributes = u2(pos + 6);
                pos += 8;
                for (int a = 0; a < attributes; a++) {
                    if (match && utf8(u2(pos)).equals("Code")) {
                        return pos + 6 + 8;  // name, length, max_stack, max_locals, code_length
                    }
                    pos += 6 + u4(pos + 2);
                }
            }
            throw new IllegalStateException("no method " + name + desc);
        }

        int skipMembers(int pos) {
            int members = u2(pos);
            pos += 2;
            for (int m = 0; m < members; m++) {
                int attributes = u2(pos + 6);
                pos += 8;
                for (int a = 0; a < attributes; a++) {
                    pos += 6 + u4(pos + 2);
                }
            }
            return pos;
        }

        /** Fail unless the instruction at {@code at} is {@code opcode} on owner.name:desc. */
        void expect(int at, int opcode, String owner, String name, String desc) {
            int ref = offsets[u2(at + 1)];
            int nat = offsets[u2(ref + 3)];
            String found = utf8(u2(offsets[u2(ref + 1)] + 1)) + "." + utf8(u2(nat + 1)) + ":"
                    + utf8(u2(nat + 3));
            String wanted = owner + "." + name + ":" + desc;
            if (u1(at) != opcode || !found.equals(wanted)) {
                throw new IllegalStateException("unexpected instruction at code offset "
                        + at + " (" + found + "), wanted " + wanted);
            }
        }
    }

    /** Constant pool entries appended after an existing pool of {@code count} slots. */
    static final class ConstantPoolWriter {
        private final ByteArrayOutputStream out = new ByteArrayOutputStream();
        int next;

        ConstantPoolWriter(int count) {
            next = count;
        }

        private int entry(int tag, int... u2s) {
            out.write(tag);
            for (int v : u2s) {
                out.write(v >>> 8);
                out.write(v);
            }
            return next++;
        }

        int utf8(String s) {
            byte[] data = s.getBytes(StandardCharsets.UTF_8);
            int index = entry(1, data.length);
            out.write(data, 0, data.length);
            return index;
        }

        int classRef(String name) {
            return entry(7, utf8(name));
        }

        int methodRef(int owner, String name, String desc) {
            int nat = entry(12, utf8(name), utf8(desc));
            return entry(10, owner, nat);
        }

        byte[] bytes() {
            return out.toByteArray();
        }
    }
}
