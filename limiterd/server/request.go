package server

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/internal/jsonscan"
)

// Request limits.
const (
	// MaxKeyBytes is the longest client key a policy names and a store keeps as itself. A
	// longer key is no error: it is decided like any other, as the client named by its digest
	// (engine.ClientKey), so that a key's length never decides whether a request is limited.
	// A key is bounded only by the request: the body (MaxBodyBytes, MaxBatchBodyBytes) or the
	// server's limit on a request's header (GET).
	MaxKeyBytes = v1alpha1.MaxClientKeyBytes
	// MaxPolicyBytes bounds the policy of a request: a request bound above the longest policy
	// ID (a 63-byte namespace, '/', a 253-byte name), so that a longer one is refused before
	// lookup.
	MaxPolicyBytes = 512
	// MaxCost bounds the cost of one request (the largest token-bucket capacity).
	MaxCost = v1alpha1.MaxCapacity
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 64 << 10
)

// AllowRequest is a decision request: POST /v1/allow {"policy": "...", "key": "...", "cost": 1}
// or GET /v1/allow?policy=...&key=...&cost=1.
type AllowRequest struct {
	// Policy is "<namespace>/<name>", or "<name>" for a policy of namespace "default" (as an
	// Envoy domain: v1alpha1.RequestedPolicyID); "" when the request names none (allowed when
	// exactly one policy is loaded).
	Policy string
	// Key identifies the client: at least 1 byte of UTF-8, of any length (see MaxKeyBytes).
	Key string
	// Cost is what the request spends, 0 to MaxCost; 1 when the request names none. 0 is a
	// peek: the answer describes the client's state and nothing is consumed.
	Cost int64
}

// errRequest is a request the decoder rejects; its text is the client's error message.
type errRequest string

func (e errRequest) Error() string { return string(e) }

var (
	errPolicyTooLong = errRequest("policy is longer than " + strconv.Itoa(MaxPolicyBytes) + " bytes")
	errCost          = errRequest("cost must be an integer between 0 and " + strconv.Itoa(MaxCost))
)

const (
	errKeyMissing     = errRequest("key is required")
	errKeyUTF8        = errRequest("key is not valid UTF-8")
	errPolicyUTF8     = errRequest("policy is not valid UTF-8")
	errNotObject      = errRequest("body must be a JSON object")
	errTrailing       = errRequest("body has data after the JSON object")
	errDuplicateField = errRequest("body names a field twice")
)

// The fields of a decision request's JSON, by their index in allowFields.
const (
	allowPolicy = iota
	allowKey
	allowCost
)

var allowFields = jsonFields{
	names: []string{allowPolicy: "policy", allowKey: "key", allowCost: "cost"},
	known: "policy, key, cost",
}

// DecodeAllowRequest decodes a JSON decision request. The JSON is strict: an object with at
// most the fields "policy" (string or null), "key" (a non-empty string of any length, see
// MaxKeyBytes) and "cost" (integer or null), each once, names matched exactly; nothing but
// whitespace after it. A cost is an integer literal
// (no fraction, no exponent) from 0 (a peek) to MaxCost, 1 when absent or null. Every error is an
// errRequest whose text can be shown to the client.
func DecodeAllowRequest(body []byte) (AllowRequest, error) {
	d := jsonDecoder{Scanner: jsonscan.Scanner{Data: body}}
	req := AllowRequest{Cost: 1}
	err := d.object(&allowFields, func(field int) error {
		var err error
		switch field {
		case allowKey:
			req.Key, err = d.key()
		case allowPolicy:
			if d.Literal("null") {
				return nil
			}
			if req.Policy, err = d.str(MaxPolicyBytes); err != nil {
				return fieldErr(err, errPolicyTooLong, errPolicyUTF8, "policy must be a string")
			}
		case allowCost:
			if d.Literal("null") {
				return nil
			}
			req.Cost, err = d.cost()
		}
		return err
	})
	if err != nil {
		return AllowRequest{}, err
	}
	if req.Key == "" {
		return AllowRequest{}, errKeyMissing
	}
	return req, nil
}

// jsonFields are the fields a JSON object may name, for jsonDecoder.object.
type jsonFields struct {
	// names are the fields, matched exactly; a field is known by its index. At most 64.
	names []string
	// known is what the error of an unknown field lists as the known ones, "a, b".
	known string
}

// index is the index of name in f.names, -1 when it is none of them.
func (f *jsonFields) index(name []byte) int {
	for i, n := range f.names {
		if string(name) == n { // no copy: a comparison
			return i
		}
	}
	return -1
}

// object reads a JSON object field by field: the object must be the whole of d's data but for
// white space around it, and each field's name one of fields.names, named at most once. For
// each field, object calls value with the index of its name in fields.names and d at the
// field's value; value reads the value whole, or returns an error. Whether a field is required
// is for the caller to check once object has returned nil. Otherwise object returns the first
// error it meets, one of:
//   - errNotObject when the data does not start with '{';
//   - malformed JSON (d.syntax), or the string error of a field name that is no valid string;
//   - "unknown field NAME (known: ...)" for a name that is not in fields.names, listing
//     fields.known (NAME left out when longer than maxFieldNameBytes);
//   - errDuplicateField for a field named twice, before its value is read;
//   - value's error, as value returned it;
//   - errTrailing for anything but white space after the object.
//
// The errors are not wrapped: their texts are the client's error messages.
func (d *jsonDecoder) object(fields *jsonFields, value func(field int) error) error {
	d.SkipSpace()
	if !d.Consume('{') {
		return errNotObject
	}
	var seen uint64 // bit i: fields.names[i] was read
	d.SkipSpace()
	if !d.Consume('}') {
		for {
			name, f := d.String(d.buf[:0], maxFieldNameBytes, jsonscan.Strict)
			switch f.Kind {
			case jsonscan.None:
			case jsonscan.TooLong:
				return errRequest("unknown field (known: " + fields.known + ")")
			case jsonscan.NotString:
				return d.syntax("a field name")
			default:
				return d.fault(f)
			}
			if f := d.Colon(); f.Failed() {
				return d.fault(f)
			}
			field := fields.index(name)
			if field < 0 {
				return errRequest(fmt.Sprintf("unknown field %s (known: %s)", strconv.QuoteToASCII(string(name)), fields.known))
			}
			if seen&(1<<field) != 0 {
				return errDuplicateField
			}
			seen |= 1 << field
			if err := value(field); err != nil {
				return err
			}
			if more, f := d.Next('}'); !more {
				if f.Failed() {
					return d.fault(f)
				}
				break
			}
		}
	}
	d.SkipSpace()
	if d.Pos != len(d.Data) {
		return errTrailing
	}
	return nil
}

// fieldErr maps the decoder's string errors to a field's messages.
func fieldErr(err, tooLong, badUTF8 error, notString string) error {
	switch {
	case errors.Is(err, errStringTooLong):
		return tooLong
	case errors.Is(err, errStringUTF8):
		return badUTF8
	case errors.Is(err, errNotString):
		return errRequest(notString)
	}
	return err
}

const (
	errStringTooLong = errRequest("string too long")
	errStringUTF8    = errRequest("string is not valid UTF-8")
	errNotString     = errRequest("not a string")
)

// jsonDecoder reads the few JSON forms a decision request holds, with the errors the client is
// shown.
type jsonDecoder struct {
	jsonscan.Scanner
	buf [64]byte // scratch for strings with escapes
}

func (d *jsonDecoder) syntax(expected string) error {
	if d.Pos >= len(d.Data) {
		return errRequest("malformed JSON: unexpected end of body, expected " + expected)
	}
	return errRequest("malformed JSON at byte " + strconv.Itoa(d.Pos) + ": expected " + expected)
}

// fault is the client's error for a fault of the scanner at d.Pos.
func (d *jsonDecoder) fault(f jsonscan.Fault) error {
	switch f.Kind {
	case jsonscan.Syntax:
		return d.syntax(f.Expected)
	case jsonscan.TooLong:
		return errStringTooLong
	case jsonscan.NotUTF8:
		return errStringUTF8
	case jsonscan.TooDeep:
		return errTooDeep
	case jsonscan.NotString:
		return errNotString
	}
	return nil
}

// key decodes a client key: a JSON string of valid UTF-8, of any length the body holds (an
// escape never decodes to more bytes than it takes).
func (d *jsonDecoder) key() (string, error) {
	s, err := d.str(len(d.Data))
	if err != nil {
		return "", fieldErr(err, errStringTooLong, errKeyUTF8, "key must be a string")
	}
	return s, nil
}

// maxFieldNameBytes bounds a field name worth reading: longer ones are unknown.
const maxFieldNameBytes = 64

// str decodes a JSON string of at most limit bytes (after unescaping) that is valid UTF-8; a
// value of another type is errNotString.
func (d *jsonDecoder) str(limit int) (string, error) {
	b, f := d.String(d.buf[:0], limit, jsonscan.Strict)
	if f.Failed() {
		return "", d.fault(f)
	}
	return string(b), nil
}

// cost decodes a JSON number that must be an integer from 0 to MaxCost.
func (d *jsonDecoder) cost() (int64, error) {
	start := d.Pos
	d.Consume('-')
	if !d.Digits() {
		if d.Pos < len(d.Data) && (d.Data[d.Pos] == '"' || d.Data[d.Pos] == 't' || d.Data[d.Pos] == 'f' || d.Data[d.Pos] == '{' || d.Data[d.Pos] == '[') {
			return 0, errCost
		}
		return 0, d.syntax("a number")
	}
	if d.Pos < len(d.Data) {
		if c := d.Data[d.Pos]; c == '.' || c == 'e' || c == 'E' {
			return 0, errCost // a fraction or an exponent: not an integer literal
		}
	}
	return parseCost(d.Data[start:d.Pos])
}

// parseCost parses a decimal cost: an optional '-', digits without a leading zero.
func parseCost(lit []byte) (int64, error) {
	if len(lit) == 0 || lit[0] == '-' {
		return 0, errCost
	}
	if lit[0] == '0' {
		if len(lit) == 1 {
			return 0, nil // a peek
		}
		return 0, errCost // a leading zero (not JSON)
	}
	if len(lit) > 10 {
		return 0, errCost
	}
	var n int64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, errCost
		}
		n = n*10 + int64(c-'0')
	}
	if n > MaxCost {
		return 0, errCost
	}
	return n, nil
}

// DecodeAllowQuery decodes a decision request from a URL query: policy, key and cost, each at
// most once, with the same bounds as DecodeAllowRequest; cost is a decimal integer.
func DecodeAllowQuery(rawQuery string) (AllowRequest, error) {
	req := AllowRequest{Cost: 1}
	var haveKey, havePolicy, haveCost bool
	for rest := rawQuery; rest != ""; {
		var pair string
		pair, rest = cut(rest, '&')
		if pair == "" {
			continue
		}
		rawName, rawValue := cut(pair, '=')
		name, err := url.QueryUnescape(rawName)
		if err != nil {
			return AllowRequest{}, errRequest("malformed query parameter name")
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return AllowRequest{}, errRequest("malformed query parameter " + strconv.QuoteToASCII(name))
		}
		switch name {
		case "key":
			if haveKey {
				return AllowRequest{}, errRequest("query names key twice")
			}
			haveKey = true
			if !utf8.ValidString(value) {
				return AllowRequest{}, errKeyUTF8
			}
			req.Key = value
		case "policy":
			if havePolicy {
				return AllowRequest{}, errRequest("query names policy twice")
			}
			havePolicy = true
			if len(value) > MaxPolicyBytes {
				return AllowRequest{}, errPolicyTooLong
			}
			if !utf8.ValidString(value) {
				return AllowRequest{}, errPolicyUTF8
			}
			req.Policy = value
		case "cost":
			if haveCost {
				return AllowRequest{}, errRequest("query names cost twice")
			}
			haveCost = true
			if req.Cost, err = parseCost([]byte(value)); err != nil {
				return AllowRequest{}, err
			}
		default:
			if len(name) > 64 {
				name = name[:64]
			}
			return AllowRequest{}, errRequest(fmt.Sprintf("unknown query parameter %s (known: policy, key, cost)", strconv.QuoteToASCII(name)))
		}
	}
	if req.Key == "" {
		return AllowRequest{}, errKeyMissing
	}
	return req, nil
}

// cut splits s at the first sep.
func cut(s string, sep byte) (before, after string) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}
