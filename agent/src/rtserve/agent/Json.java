package rtserve.agent;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Just enough JSON for the live routes file (see {@link Routes}): RFC 8259 values read into
 * {@code Map<String, Object>} (insertion order), {@code List<Object>}, {@code String}, {@code Double},
 * {@code Boolean} and {@code null}, and strings written back with their escapes. The agent builds
 * with the JDK alone, which has no JSON parser.
 */
final class Json {
    /** The input is not one JSON value; the message names what and where. */
    static final class ParseError extends Exception {
        private static final long serialVersionUID = 1L;

        ParseError(String message) {
            super(message);
        }
    }

    private static final int MAX_DEPTH = 32;

    private final String s;
    private int at;

    private Json(String s) {
        this.s = s;
    }

    /** The one value in {@code text} (whitespace around it allowed). */
    static Object parse(String text) throws ParseError {
        Json p = new Json(text);
        p.space();
        Object value = p.value(0);
        p.space();
        if (p.at < text.length()) {
            throw p.error("unexpected text after the value");
        }
        return value;
    }

    /** {@code text} as a JSON string literal, quotes included. */
    static String quote(String text) {
        StringBuilder out = new StringBuilder(text.length() + 2).append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20 || Character.isSurrogate(c) && !validSurrogate(text, i)) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        return out.append('"').toString();
    }

    private static boolean validSurrogate(String text, int i) {
        char c = text.charAt(i);
        if (Character.isHighSurrogate(c)) {
            return i + 1 < text.length() && Character.isLowSurrogate(text.charAt(i + 1));
        }
        return i > 0 && Character.isHighSurrogate(text.charAt(i - 1));
    }

    private ParseError error(String what) {
        return new ParseError("invalid JSON at character " + at + ": " + what);
    }

    private void space() {
        while (at < s.length() && " \t\r\n".indexOf(s.charAt(at)) >= 0) {
            at++;
        }
    }

    private Object value(int depth) throws ParseError {
        if (depth > MAX_DEPTH) {
            throw error("nested deeper than " + MAX_DEPTH);
        }
        if (at >= s.length()) {
            throw error("unexpected end");
        }
        char c = s.charAt(at);
        switch (c) {
            case '{': return object(depth);
            case '[': return array(depth);
            case '"': return string();
            case 't': return word("true", Boolean.TRUE);
            case 'f': return word("false", Boolean.FALSE);
            case 'n': return word("null", null);
            default:
                if (c == '-' || (c >= '0' && c <= '9')) {
                    return number();
                }
                throw error("unexpected '" + c + "'");
        }
    }

    private Object word(String word, Object value) throws ParseError {
        if (!s.startsWith(word, at)) {
            throw error("unexpected '" + s.charAt(at) + "'");
        }
        at += word.length();
        return value;
    }

    private Map<String, Object> object(int depth) throws ParseError {
        Map<String, Object> out = new LinkedHashMap<>();
        at++;
        space();
        if (at < s.length() && s.charAt(at) == '}') {
            at++;
            return out;
        }
        while (true) {
            space();
            if (at >= s.length() || s.charAt(at) != '"') {
                throw error("expected a quoted key");
            }
            String key = string();
            space();
            expect(':');
            space();
            if (out.containsKey(key)) {
                throw error("duplicate key \"" + key + "\"");
            }
            out.put(key, value(depth + 1));
            space();
            if (at < s.length() && s.charAt(at) == ',') {
                at++;
                continue;
            }
            expect('}');
            return out;
        }
    }

    private List<Object> array(int depth) throws ParseError {
        List<Object> out = new ArrayList<>();
        at++;
        space();
        if (at < s.length() && s.charAt(at) == ']') {
            at++;
            return out;
        }
        while (true) {
            space();
            out.add(value(depth + 1));
            space();
            if (at < s.length() && s.charAt(at) == ',') {
                at++;
                continue;
            }
            expect(']');
            return out;
        }
    }

    private void expect(char c) throws ParseError {
        if (at >= s.length() || s.charAt(at) != c) {
            throw error("expected '" + c + "'");
        }
        at++;
    }

    private String string() throws ParseError {
        StringBuilder out = new StringBuilder();
        at++;
        while (true) {
            if (at >= s.length()) {
                throw error("unterminated string");
            }
            char c = s.charAt(at++);
            if (c == '"') {
                return out.toString();
            }
            if (c < 0x20) {
                throw error("control character in a string");
            }
            if (c != '\\') {
                out.append(c);
                continue;
            }
            if (at >= s.length()) {
                throw error("unterminated string");
            }
            char e = s.charAt(at++);
            switch (e) {
                case '"': case '\\': case '/': out.append(e); break;
                case 'b': out.append('\b'); break;
                case 'f': out.append('\f'); break;
                case 'n': out.append('\n'); break;
                case 'r': out.append('\r'); break;
                case 't': out.append('\t'); break;
                case 'u':
                    if (at + 4 > s.length()) {
                        throw error("short \\u escape");
                    }
                    try {
                        out.append((char) Integer.parseInt(s.substring(at, at + 4), 16));
                    } catch (NumberFormatException x) {
                        throw error("bad \\u escape");
                    }
                    at += 4;
                    break;
                default:
                    at -= 2;  // point at the backslash
                    throw error("bad escape '\\" + e + "'");
            }
        }
    }

    private Double number() throws ParseError {
        int start = at;
        if (s.charAt(at) == '-') {
            at++;
        }
        if (!digits()) {
            throw error("expected a digit");
        }
        if (at < s.length() && s.charAt(at) == '.') {
            at++;
            if (!digits()) {
                throw error("expected a digit after '.'");
            }
        }
        if (at < s.length() && (s.charAt(at) == 'e' || s.charAt(at) == 'E')) {
            at++;
            if (at < s.length() && (s.charAt(at) == '+' || s.charAt(at) == '-')) {
                at++;
            }
            if (!digits()) {
                throw error("expected an exponent");
            }
        }
        return Double.valueOf(s.substring(start, at));
    }

    private boolean digits() {
        int start = at;
        while (at < s.length() && s.charAt(at) >= '0' && s.charAt(at) <= '9') {
            at++;
        }
        return at > start;
    }
}
