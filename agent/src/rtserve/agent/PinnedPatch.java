package rtserve.agent;

import java.io.ByteArrayOutputStream;
import java.lang.instrument.ClassFileTransformer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.ProtectionDomain;
import java.util.List;

/**
 * One patch of one class of TorchServe 0.12.0's frontend: instructions of one method replaced by
 * calls to static methods of a helper class of this agent (see {@link Agent} for the patches).
 *
 * <p>Each replacement is the same length as the instruction it replaces ({@code getfield} or
 * {@code invokevirtual} becomes {@code invokestatic}, 3 bytes each) and leaves the operand stack as
 * it was, so no offset, branch or stack map changes. Before patching, the transformer checks that
 * the class is exactly the one the patch was written against (its SHA-256) and that each replaced
 * instruction is where that class has it; otherwise it leaves the class stock and says why on the
 * frontend's stderr. The JDK's own {@code java.lang.instrument} API is all it uses.
 */
final class PinnedPatch implements ClassFileTransformer {
    /**
     * The instruction at {@code offset} of the method's code, {@code opcode} on
     * {@code owner.name:desc}, becomes {@code invokestatic helper.helperMethod:helperDesc}.
     */
    record Swap(int offset, int opcode, String owner, String name, String desc,
                String helperMethod, String helperDesc) {
    }

    static final int GETFIELD = 0xb4;
    static final int INVOKEVIRTUAL = 0xb6;
    static final int INVOKESTATIC = 0xb8;

    final String feature;
    final String target;
    final String expected;
    final String method;
    final String methodDesc;
    final String helper;
    final List<Swap> swaps;
    final String effect;
    final String stock;
    private Runnable onPatched = () -> { };

    /**
     * @param feature what the patch gives, for the log ("greedy batching")
     * @param target the class to patch (internal name)
     * @param expected SHA-256 of the class file the patch was written against
     * @param method the patched method's name and descriptor
     * @param helper the class holding the replacements' static methods (internal name)
     * @param effect what the patched method now does, for the log
     * @param stock what runs instead when the class is not the pinned one, for the log
     */
    PinnedPatch(String feature, String target, String expected, String method, String methodDesc,
                String helper, List<Swap> swaps, String effect, String stock) {
        this.feature = feature;
        this.target = target;
        this.expected = expected;
        this.method = method;
        this.methodDesc = methodDesc;
        this.helper = helper;
        this.swaps = swaps;
        this.effect = effect;
        this.stock = stock;
    }

    /** Run {@code action} once the class is patched (never when it stays stock). */
    PinnedPatch onPatched(Runnable action) {
        onPatched = action;
        return this;
    }

    @Override
    public byte[] transform(ClassLoader loader, String className, Class<?> redefined,
                            ProtectionDomain domain, byte[] classfile) {
        if (!target.equals(className)) {
            return null;
        }
        try {
            String actual = sha256(classfile);
            if (!actual.equals(expected)) {
                Agent.log(feature + " OFF: " + target + ".class has SHA-256 " + actual
                        + ", not the pinned " + expected + " (not TorchServe 0.12.0's frontend); "
                        + stock);
                return null;
            }
            byte[] patched = patch(classfile);
            Agent.log(feature + " ON: patched " + target + "." + method + " (" + effect + ")");
            onPatched.run();
            return patched;
        } catch (RuntimeException | NoSuchAlgorithmException e) {
            Agent.log(feature + " OFF: " + e.getMessage() + "; " + stock);
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

    /** The class with every swap applied (see the class comment). */
    byte[] patch(byte[] in) {
        ClassReader cls = new ClassReader(in);
        int code = cls.codeOf(method, methodDesc);
        for (Swap swap : swaps) {
            cls.expect(code + swap.offset(), swap.opcode(), swap.owner(), swap.name(), swap.desc());
        }
        // New constant pool entries go after the existing ones: no existing index moves.
        ConstantPoolWriter pool = new ConstantPoolWriter(cls.count);
        int helperClass = pool.classRef(helper);
        int[] refs = new int[swaps.size()];
        for (int i = 0; i < refs.length; i++) {
            refs[i] = pool.methodRef(helperClass, swaps.get(i).helperMethod(), swaps.get(i).helperDesc());
        }

        byte[] extra = pool.bytes();
        byte[] out = new byte[in.length + extra.length];
        System.arraycopy(in, 0, out, 0, cls.poolEnd);
        System.arraycopy(extra, 0, out, cls.poolEnd, extra.length);
        System.arraycopy(in, cls.poolEnd, out, cls.poolEnd + extra.length, in.length - cls.poolEnd);
        putU2(out, 8, pool.next);
        int shift = extra.length;
        for (int i = 0; i < refs.length; i++) {
            int at = code + swaps.get(i).offset() + shift;
            out[at] = (byte) INVOKESTATIC;
            putU2(out, at + 1, refs[i]);
        }
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
