package policy

import (
	"unicode/utf16"
	"unicode/utf8"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// A JWTClaim key source reads a claim of a JSON Web Token (RFC 7519) in JWS compact form
// (RFC 7515): three base64url segments, header.payload.signature. It never checks the
// signature, the expiry or the issuer: the gateway verified the token before it asked, and
// must have refused or replaced any token the client sent that it did not verify. So the
// token is read strictly and cheaply, and the rules below decide what it says:
//
//   - the header's value is the token; for Authorization, "Bearer <token>" (the scheme in any
//     case), and another scheme (Basic) holds no token: no key from this source;
//   - each segment is unpadded base64url (A-Z a-z 0-9 - _, no '=', no line breaks), the
//     header and payload segments non-empty; the header and signature segments are not decoded;
//   - the payload, at most 3072 bytes (the header is at most v1alpha1.MaxGatewayHeaderBytes),
//     is one JSON object (RFC 8259) in valid UTF-8, white space around it allowed;
//   - a name on the claim's path given twice in one object refuses the token, as a verifier
//     and limiterd could each read a different one (the last, the first) and disagree on the
//     client; other names may repeat;
//   - a string value (escapes decoded as encoding/json decodes them: a lone surrogate is
//     U+FFFD) or an integer one (an optional '-' and digits, no fraction or exponent, kept as
//     written) is the key; an absent claim, an empty string, null, true, false, another
//     number, an object or an array yield no key.
//
// A token that breaks the form is refused with ErrMalformedJWT: the gateway verified it, so a
// malformed one is a gateway's or a policy's mistake to show, not a client to key.

// maxJWTPayloadBytes is the longest decoded payload of a token in a header of at most
// v1alpha1.MaxGatewayHeaderBytes.
const maxJWTPayloadBytes = v1alpha1.MaxGatewayHeaderBytes / 4 * 3

// bearerScheme is the authentication scheme of a token in Authorization (RFC 6750).
const bearerScheme = "bearer"

// jwtToken returns the token in a JWTClaim source's header value v: v itself, or for
// Authorization the token after "Bearer ". ok is false when v holds no token: empty, or another
// scheme in Authorization.
func (s *keySource) jwtToken(v string) (token string, ok bool) {
	if !s.bearer || v == "" {
		return v, v != ""
	}
	i := 0
	for i < len(v) && v[i] != ' ' {
		i++
	}
	if i != len(bearerScheme) || !equalFoldASCII(v[:i], bearerScheme) {
		return "", false
	}
	for i < len(v) && v[i] == ' ' {
		i++
	}
	return v[i:], true // "Bearer" alone: an empty token, malformed
}

// equalFoldASCII reports whether s equals lower, which is in lower case, ignoring ASCII case.
func equalFoldASCII(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// appendJWTClaim appends the claim path of token's payload to dst, after prefix, and reports
// whether the claim is a key. It returns ok false when the token is malformed.
func appendJWTClaim(dst []byte, prefix, token string, path []string) (out []byte, found, ok bool) {
	var buf [maxJWTPayloadBytes]byte
	payload, ok := decodeJWTPayload(buf[:], token)
	if !ok {
		return dst, false, false
	}
	v, ok := findClaim(payload, path)
	switch {
	case !ok:
		return dst, false, false
	case v.kind == claimNone || v.start == v.end:
		return dst, false, true
	}
	raw := payload[v.start:v.end]
	dst = append(dst, prefix...)
	if v.kind == claimInteger || !v.escaped {
		return append(dst, raw...), true, true
	}
	for i := 0; i < len(raw); {
		r, n := nextRune(raw, i)
		dst = utf8.AppendRune(dst, r)
		i += n
	}
	return dst, true, true
}

// decodeJWTPayload decodes the payload segment of token into buf, and reports whether token is
// three unpadded base64url segments, the first two non-empty, the payload fitting buf.
func decodeJWTPayload(buf []byte, token string) ([]byte, bool) {
	var dots [2]int
	n := 0
	for i := 0; i < len(token); i++ {
		switch base64URL[token[i]] {
		case base64URLDot:
			if n == len(dots) {
				return nil, false
			}
			dots[n] = i
			n++
		case base64URLInvalid:
			return nil, false
		}
	}
	if n != len(dots) {
		return nil, false
	}
	header, payload, sig := token[:dots[0]], token[dots[0]+1:dots[1]], token[dots[1]+1:]
	// A length of 4k+1 is no base64: the payload's would not decode, and the others are held
	// to the same form without being decoded.
	if header == "" || payload == "" || len(header)%4 == 1 || len(payload)%4 == 1 || len(sig)%4 == 1 ||
		len(payload)/4*3+len(payload)%4 > len(buf) {
		return nil, false
	}
	return buf[:decodeBase64URL(buf, payload)], true
}

// decodeBase64URL decodes s, unpadded base64url of a length other than 4k+1, into dst, which has
// room, and returns the length decoded. As encoding/base64's RawURLEncoding (not Strict), it
// ignores the unused low bits of the last character.
func decodeBase64URL(dst []byte, s string) int {
	n := 0
	for ; len(s) >= 4; s = s[4:] {
		v := uint32(base64URL[s[0]])<<18 | uint32(base64URL[s[1]])<<12 | uint32(base64URL[s[2]])<<6 | uint32(base64URL[s[3]])
		dst[n], dst[n+1], dst[n+2] = byte(v>>16), byte(v>>8), byte(v)
		n += 3
	}
	switch len(s) {
	case 2:
		dst[n] = base64URL[s[0]]<<2 | base64URL[s[1]]>>4
		n++
	case 3:
		v := uint32(base64URL[s[0]])<<12 | uint32(base64URL[s[1]])<<6 | uint32(base64URL[s[2]])
		dst[n], dst[n+1] = byte(v>>10), byte(v>>2)
		n += 2
	}
	return n
}

// Values of base64URL that are no base64url digit.
const (
	base64URLInvalid = 0xff
	base64URLDot     = 0xfe
)

// base64URL maps a character of a token to its value as a base64url digit, or to
// base64URLDot ('.') or base64URLInvalid.
var base64URL = func() (t [256]byte) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range t {
		t[i] = base64URLInvalid
	}
	for i := range len(alphabet) {
		t[alphabet[i]] = byte(i)
	}
	t['.'] = base64URLDot
	return t
}()

// claimKind is the kind of a claim's value, as far as a key is concerned.
type claimKind uint8

const (
	claimNone    claimKind = iota // absent, or of a type that is no key
	claimString                   // a JSON string
	claimInteger                  // a JSON number without fraction or exponent
)

// claimValue is the value of the claim findClaim looked for.
type claimValue struct {
	kind claimKind
	// start and end delimit the value as written in the payload (indexes, not a slice, so that
	// the payload need not escape to the heap): a string's contents between its quotes, with
	// escapes when escaped, an integer's characters.
	start, end int
	escaped    bool
}

// findClaim reads payload, which must be one JSON object, and returns the value at path (each
// name a member of the object the previous one names). It reports false when payload is no JSON
// object in valid UTF-8, or when an object on the path names the next name of path twice.
func findClaim(payload []byte, path []string) (claimValue, bool) {
	r := claimReader{b: payload}
	var v claimValue
	r.space()
	if r.i >= len(r.b) || r.b[r.i] != '{' || !r.object(path, &v) {
		return claimValue{}, false
	}
	r.space()
	return v, r.i == len(r.b)
}

// claimReader is a validating JSON reader over b, at b[i].
type claimReader struct {
	b []byte
	i int
}

func (r *claimReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next reports whether b[i] is c, and if so steps over it.
func (r *claimReader) next(c byte) bool {
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// object reads the object at b[i] ('{'). When path is not empty, it looks for the member
// path[0]: the last name sets *v, another descends into the object it names (a value of another
// type is skipped: the path names nothing).
func (r *claimReader) object(path []string, v *claimValue) bool {
	r.i++ // '{'
	r.space()
	if r.next('}') {
		return true
	}
	seen := false
	for {
		if r.i >= len(r.b) || r.b[r.i] != '"' {
			return false
		}
		name, escaped, ok := r.str()
		if !ok {
			return false
		}
		r.space()
		if !r.next(':') {
			return false
		}
		r.space()
		match := len(path) > 0 && nameEquals(name, escaped, path[0])
		if match {
			if seen {
				return false
			}
			seen = true
		}
		switch {
		case match && len(path) == 1:
			ok = r.claim(v)
		case match && r.i < len(r.b) && r.b[r.i] == '{':
			ok = r.object(path[1:], v)
		default:
			ok = r.value()
		}
		if !ok {
			return false
		}
		r.space()
		switch {
		case r.next('}'):
			return true
		case !r.next(','):
			return false
		}
		r.space()
	}
}

// claim reads the claim's value at b[i] into *v.
func (r *claimReader) claim(v *claimValue) bool {
	if r.i >= len(r.b) {
		return false
	}
	start := r.i
	switch c := r.b[r.i]; {
	case c == '"':
		_, escaped, ok := r.str()
		*v = claimValue{kind: claimString, start: start + 1, end: r.i - 1, escaped: escaped}
		return ok
	case c == '-' || '0' <= c && c <= '9':
		integer, ok := r.number()
		if integer {
			*v = claimValue{kind: claimInteger, start: start, end: r.i}
		}
		return ok
	}
	return r.value()
}

// value reads any JSON value at b[i].
func (r *claimReader) value() bool {
	if r.i >= len(r.b) {
		return false
	}
	switch c := r.b[r.i]; {
	case c == '{':
		return r.object(nil, nil)
	case c == '[':
		return r.array()
	case c == '"':
		_, _, ok := r.str()
		return ok
	case c == '-' || '0' <= c && c <= '9':
		_, ok := r.number()
		return ok
	case c == 't':
		return r.literal("true")
	case c == 'f':
		return r.literal("false")
	case c == 'n':
		return r.literal("null")
	}
	return false
}

func (r *claimReader) array() bool {
	r.i++ // '['
	r.space()
	if r.next(']') {
		return true
	}
	for {
		if !r.value() {
			return false
		}
		r.space()
		switch {
		case r.next(']'):
			return true
		case !r.next(','):
			return false
		}
		r.space()
	}
}

func (r *claimReader) literal(s string) bool {
	if len(r.b)-r.i < len(s) || string(r.b[r.i:r.i+len(s)]) != s {
		return false
	}
	r.i += len(s)
	return true
}

// number reads the number at b[i], and reports whether it has neither fraction nor exponent.
func (r *claimReader) number() (integer, ok bool) {
	r.next('-')
	switch {
	case r.next('0'):
	case r.i < len(r.b) && '1' <= r.b[r.i] && r.b[r.i] <= '9':
		r.digits()
	default:
		return false, false
	}
	integer = true
	if r.next('.') {
		integer = false
		if !r.digits() {
			return false, false
		}
	}
	if r.next('e') || r.next('E') {
		integer = false
		if !r.next('+') {
			r.next('-')
		}
		if !r.digits() {
			return false, false
		}
	}
	return integer, true
}

// digits reads one or more digits, and reports whether there was one.
func (r *claimReader) digits() bool {
	start := r.i
	for r.i < len(r.b) && '0' <= r.b[r.i] && r.b[r.i] <= '9' {
		r.i++
	}
	return r.i > start
}

// str reads the string at b[i] ('"'), and returns its contents between the quotes, and whether
// they hold an escape. It refuses a control character and invalid UTF-8.
func (r *claimReader) str() (s []byte, escaped, ok bool) {
	r.i++ // '"'
	start := r.i
	for r.i < len(r.b) {
		switch c := r.b[r.i]; {
		case c == '"':
			s = r.b[start:r.i]
			r.i++
			return s, escaped, true
		case c == '\\':
			escaped = true
			if r.i+1 >= len(r.b) {
				return nil, false, false
			}
			switch r.b[r.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				r.i += 2
			case 'u':
				if len(r.b)-r.i < 6 || hex4(r.b[r.i+2:r.i+6]) < 0 {
					return nil, false, false
				}
				r.i += 6
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		case c < utf8.RuneSelf:
			r.i++
		default:
			c, n := utf8.DecodeRune(r.b[r.i:])
			if c == utf8.RuneError && n == 1 {
				return nil, false, false
			}
			r.i += n
		}
	}
	return nil, false, false
}

// hex4 returns the value of four hex digits, -1 when b is not.
func hex4(b []byte) rune {
	var v rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		v = v<<4 | rune(c)
	}
	return v
}

// nextRune decodes the rune at s[i] of a string's contents that str accepted, and returns its
// length there. A \u escape of a lone surrogate is U+FFFD, as encoding/json decodes it.
func nextRune(s []byte, i int) (rune, int) {
	c := s[i]
	if c != '\\' {
		if c < utf8.RuneSelf {
			return rune(c), 1
		}
		return utf8.DecodeRune(s[i:])
	}
	switch s[i+1] {
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r := hex4(s[i+2:])
		if !utf16.IsSurrogate(r) {
			return r, 6
		}
		if len(s)-i >= 12 && s[i+6] == '\\' && s[i+7] == 'u' {
			if d := utf16.DecodeRune(r, hex4(s[i+8:])); d != utf8.RuneError {
				return d, 12
			}
		}
		return utf8.RuneError, 6
	}
	return rune(s[i+1]), 2 // '"', '\\', '/'
}

// nameEquals reports whether the member name s (escaped when it holds escapes) decodes to want.
func nameEquals(s []byte, escaped bool, want string) bool {
	if !escaped {
		return string(s) == want
	}
	j := 0
	for i := 0; i < len(s); {
		r, n := nextRune(s, i)
		// want is ASCII (a claim name), so each of its bytes is a rune.
		if j >= len(want) || r != rune(want[j]) {
			return false
		}
		i += n
		j++
	}
	return j == len(want)
}
