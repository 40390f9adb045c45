package policy

import (
	"strings"
	"unicode/utf8"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/internal/jsonscan"
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

// claimKeyName returns how the claim of path is written in a key: its names joined by '.',
// with '%', '.' and ':' in a name written %25, %2E and %3A. A name of a claim ("org.id") holds
// none of them, so its key is as it was before claimPath; and since no name so written holds
// '.' or ':', two paths are written alike only when they are equal, and the ':' after the
// claim in the key ends it ("urn" with the value "acme:x" and "urn:acme" with "x" are
// "urn:acme:x" and "urn%3Aacme:x").
func claimKeyName(path []string) string {
	var b strings.Builder
	for i, name := range path {
		if i > 0 {
			b.WriteByte('.')
		}
		for j := 0; j < len(name); j++ {
			switch c := name[j]; c {
			case '%':
				b.WriteString("%25")
			case '.':
				b.WriteString("%2E")
			case ':':
				b.WriteString("%3A")
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String()
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
	dst = append(dst, prefix...)
	return append(dst, payload[v.start:v.end]...), true, true
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
	// start and end delimit the value in the payload (indexes, not a slice, so that the payload
	// need not escape to the heap): a string's contents decoded, an integer's characters.
	start, end int
}

// findClaim reads payload, which must be one JSON object, and returns the value at path (each
// name a member of the object the previous one names). It reports false when payload is no JSON
// object in valid UTF-8, or when an object on the path names the next name of path twice. It
// decodes the names on the path, and the claim, in place: payload is the reader's to change.
func findClaim(payload []byte, path []string) (claimValue, bool) {
	// Outside its strings, well-formed JSON is ASCII: so all of it is valid UTF-8 when its
	// strings are, and the strings skipped need not be checked one by one.
	if !utf8.Valid(payload) {
		return claimValue{}, false
	}
	s := jsonscan.Scanner{Data: payload}
	var v claimValue
	s.SkipSpace()
	if s.Pos >= len(payload) || payload[s.Pos] != '{' || !findMember(&s, path, &v) {
		return claimValue{}, false
	}
	s.SkipSpace()
	return v, s.Pos == len(payload)
}

// findMember reads the object at Pos ('{'), looking for the member path[0]: the last name of
// path sets *v, another descends into the object it names (a value of another type is skipped:
// the path names nothing).
func findMember(s *jsonscan.Scanner, path []string, v *claimValue) bool {
	if s.Open('}') {
		return true
	}
	seen := false
	for {
		name, f := s.StringInPlace(len(s.Data), jsonscan.Replace)
		if f.Failed() || s.Colon().Failed() {
			return false
		}
		match := len(path) > 0 && string(name) == path[0]
		if match {
			if seen {
				return false
			}
			seen = true
		}
		var ok bool
		switch {
		case match && len(path) == 1:
			ok = readClaim(s, v)
		case match && s.Pos < len(s.Data) && s.Data[s.Pos] == '{':
			ok = findMember(s, path[1:], v)
		default:
			ok = !s.Skip(len(s.Data)).Failed()
		}
		if !ok {
			return false
		}
		if more, f := s.Next('}'); !more {
			return !f.Failed()
		}
	}
}

// readClaim reads the claim's value at Pos into *v.
func readClaim(s *jsonscan.Scanner, v *claimValue) bool {
	if s.Pos >= len(s.Data) {
		return false
	}
	start := s.Pos
	switch c := s.Data[s.Pos]; {
	case c == '"':
		b, f := s.StringInPlace(len(s.Data), jsonscan.Replace)
		*v = claimValue{kind: claimString, start: start + 1, end: start + 1 + len(b)}
		return !f.Failed()
	case c == '-' || '0' <= c && c <= '9':
		integer, f := s.Number()
		if integer {
			*v = claimValue{kind: claimInteger, start: start, end: s.Pos}
		}
		return !f.Failed()
	}
	// Of another type: no key. The payload's length bounds the depth.
	return !s.Skip(len(s.Data)).Failed()
}
