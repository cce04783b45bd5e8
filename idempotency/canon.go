package idempotency

import (
	"bytes"
	"fmt"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// canon appends the canonical form of the JSON value at the start of src
// to dst and returns it with the rest of src. Canonical: no whitespace,
// object members sorted by name (bytewise, on the decoded names),
// duplicate names rejected, strings decoded and re-escaped one way,
// numbers, true, false and null as written. It allocates only to sort the
// members of objects of more than 8 members, to decode strings with
// escapes and for errors; dst grows as needed (Fingerprint pools it).
func canon(dst, src []byte, depth int) ([]byte, []byte, error) {
	if depth > maxDepth {
		return dst, src, fmt.Errorf("%w: nested deeper than %d", ErrBody, maxDepth)
	}
	src = skipSpace(src)
	if len(src) == 0 {
		return dst, src, fmt.Errorf("%w: unexpected end", ErrBody)
	}
	switch c := src[0]; {
	case c == '{':
		return canonObject(dst, src[1:], depth)
	case c == '[':
		dst = append(dst, '[')
		src = skipSpace(src[1:])
		if len(src) > 0 && src[0] == ']' {
			return append(dst, ']'), src[1:], nil
		}
		for {
			var err error
			if dst, src, err = canon(dst, src, depth+1); err != nil {
				return dst, src, err
			}
			src = skipSpace(src)
			if len(src) == 0 {
				return dst, src, fmt.Errorf("%w: unterminated array", ErrBody)
			}
			if src[0] == ']' {
				return append(dst, ']'), src[1:], nil
			}
			if src[0] != ',' {
				return dst, src, fmt.Errorf("%w: want , or ] in array", ErrBody)
			}
			dst = append(dst, ',')
			src = src[1:]
		}
	case c == '"':
		s, rest, err := scanString(src)
		if err != nil {
			return dst, src, err
		}
		return appendString(dst, s), rest, nil
	case c == '-' || (c >= '0' && c <= '9'):
		n := scanNumber(src)
		if n == 0 {
			return dst, src, fmt.Errorf("%w: bad number", ErrBody)
		}
		return append(dst, src[:n]...), src[n:], nil
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if bytes.HasPrefix(src, []byte(lit)) {
				return append(dst, lit...), src[len(lit):], nil
			}
		}
		return dst, src, fmt.Errorf("%w: unexpected %q", ErrBody, c)
	}
}

type member struct {
	name       []byte // decoded
	start, end int    // the canonical value, in dst past the object's start
}

// canonObject canonicalises the object after its '{'. Its members' values
// are canonicalised into dst past the object's start, then the sorted
// object is appended after them and moved down over them: no buffer of its
// own, so no allocation unless it has more than 8 members.
func canonObject(dst, src []byte, depth int) ([]byte, []byte, error) {
	var (
		small   [8]member
		members = small[:0]
		base    = len(dst)
	)
	src = skipSpace(src)
	if len(src) > 0 && src[0] == '}' {
		return append(dst, '{', '}'), src[1:], nil
	}
	for {
		src = skipSpace(src)
		if len(src) == 0 || src[0] != '"' {
			return dst, src, fmt.Errorf("%w: want a member name", ErrBody)
		}
		name, rest, err := scanString(src)
		if err != nil {
			return dst, src, err
		}
		src = skipSpace(rest)
		if len(src) == 0 || src[0] != ':' {
			return dst, src, fmt.Errorf("%w: want : after a member name", ErrBody)
		}
		start := len(dst)
		if dst, src, err = canon(dst, src[1:], depth+1); err != nil {
			return dst, src, err
		}
		members = append(members, member{name: name, start: start, end: len(dst)})
		src = skipSpace(src)
		if len(src) == 0 {
			return dst, src, fmt.Errorf("%w: unterminated object", ErrBody)
		}
		if src[0] == '}' {
			src = src[1:]
			break
		}
		if src[0] != ',' {
			return dst, src, fmt.Errorf("%w: want , or } in object", ErrBody)
		}
		src = src[1:]
	}
	slices.SortFunc(members, func(a, b member) int { return bytes.Compare(a.name, b.name) })
	values := len(dst)
	dst = append(dst, '{')
	for i, m := range members {
		if i > 0 {
			if bytes.Equal(members[i-1].name, m.name) {
				return dst, src, fmt.Errorf("%w: member %q twice", ErrBody, m.name)
			}
			dst = append(dst, ',')
		}
		dst = appendString(dst, m.name)
		dst = append(dst, ':')
		dst = append(dst, dst[m.start:m.end]...) // lies before values: appending never overwrites it
	}
	dst = append(dst, '}')
	n := copy(dst[base:], dst[values:])
	return dst[:base+n], src, nil
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// scanString returns the decoded content of the JSON string at the start
// of src (without copying when it has no escapes) and the rest.
func scanString(src []byte) ([]byte, []byte, error) {
	i := 1
	for ; i < len(src); i++ {
		switch c := src[i]; {
		case c == '"':
			if !utf8.Valid(src[1:i]) {
				return nil, src, fmt.Errorf("%w: invalid UTF-8 in a string", ErrBody)
			}
			return src[1:i], src[i+1:], nil
		case c == '\\':
			return scanEscaped(src)
		case c < 0x20:
			return nil, src, fmt.Errorf("%w: control character in a string", ErrBody)
		}
	}
	return nil, src, fmt.Errorf("%w: unterminated string", ErrBody)
}

// scanEscaped is scanString's slow path: it decodes JSON escapes.
func scanEscaped(src []byte) ([]byte, []byte, error) {
	out := make([]byte, 0, len(src))
	bad := func() error { return fmt.Errorf("%w: bad string escape", ErrBody) }
	for i := 1; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '"':
			if !utf8.Valid(out) {
				return nil, src, fmt.Errorf("%w: invalid UTF-8 in a string", ErrBody)
			}
			return out, src[i+1:], nil
		case c < 0x20:
			return nil, src, fmt.Errorf("%w: control character in a string", ErrBody)
		case c != '\\':
			out = append(out, c)
			continue
		}
		i++
		if i >= len(src) {
			break
		}
		switch src[i] {
		case '"', '\\', '/':
			out = append(out, src[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(src[i+1:])
			if !ok {
				return nil, src, bad()
			}
			i += 4
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if i+2 < len(src) && src[i+1] == '\\' && src[i+2] == 'u' {
					r2, ok = hex4(src[i+3:])
				}
				if r = utf16.DecodeRune(r, r2); !ok || r == utf8.RuneError {
					return nil, src, bad()
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, src, bad()
		}
	}
	return nil, src, fmt.Errorf("%w: unterminated string", ErrBody)
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// appendString appends s as a JSON string, escaping only what JSON requires.
func appendString(dst, s []byte) []byte {
	const hexd = "0123456789abcdef"
	dst = append(dst, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// scanNumber returns the length of the JSON number at the start of b, or 0.
func scanNumber(b []byte) int {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return 0
	}
	if i < len(b) && b[i] == '.' {
		i++
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == j {
			return 0
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == j {
			return 0
		}
	}
	return i
}
