// Package jsonscan reads strict JSON (RFC 8259) out of a byte slice a piece at a time, without
// allocating: white space, punctuation, literals, numbers, strings (decoded, escapes and
// surrogate pairs included) and whole values skipped. It is the one JSON scanner of limiterd's
// hand-written readers: the decisions API's request decoder (limiterd/server) and the JWT claim
// reader of a gateway's key sources (limiterd/policy), which read JSON from outside on every
// decision and cannot afford encoding/json's allocations.
//
// A Scanner reads Data from Pos. A method that fails returns a Fault saying why and leaves Pos
// where it found the fault, so that the caller can say where; the caller words the message.
package jsonscan

import (
	"unicode/utf16"
	"unicode/utf8"
)

// Scanner reads Data from Pos.
type Scanner struct {
	Data []byte
	Pos  int
}

// Kind is the kind of a Fault.
type Kind uint8

const (
	// None is no fault: the zero Fault.
	None Kind = iota
	// Syntax is malformed JSON: Fault.Expected is what Data should hold at Pos (at its end when
	// Pos is len(Data)).
	Syntax
	// TooLong is a string that decodes to more bytes than the caller's limit.
	TooLong
	// NotUTF8 is a string that is not valid UTF-8, or holds an escaped lone surrogate where the
	// caller refuses them (Strict).
	NotUTF8
	// TooDeep is a value nested deeper than the caller's limit.
	TooDeep
	// NotString is a value of another type where String reads a string: Data holds at Pos the
	// first byte of an object, an array, a number, true, false or null.
	NotString
)

// Fault is why a method failed. It is a value, not an error, so that a caller that only needs
// to know whether JSON is well formed pays nothing for the message.
type Fault struct {
	Kind Kind
	// Expected is, for Syntax, what Data should hold at Pos: "a value", "':' after a field
	// name"...
	Expected string
}

// Failed reports whether f is a fault.
func (f Fault) Failed() bool { return f.Kind != None }

func syntax(expected string) Fault { return Fault{Kind: Syntax, Expected: expected} }

// SkipSpace steps over white space: space, tab, line feed, carriage return.
func (s *Scanner) SkipSpace() {
	for s.Pos < len(s.Data) {
		switch s.Data[s.Pos] {
		case ' ', '\t', '\n', '\r':
			s.Pos++
		default:
			return
		}
	}
}

// Consume steps over c and reports true when c is the byte at Pos.
func (s *Scanner) Consume(c byte) bool {
	if s.Pos < len(s.Data) && s.Data[s.Pos] == c {
		s.Pos++
		return true
	}
	return false
}

// Literal steps over lit ("true", "false", "null") and reports true when Data holds it at Pos.
func (s *Scanner) Literal(lit string) bool {
	if len(s.Data)-s.Pos >= len(lit) && string(s.Data[s.Pos:s.Pos+len(lit)]) == lit {
		s.Pos += len(lit)
		return true
	}
	return false
}

// Open steps over the '{' or '[' at Pos and the white space after it, and reports whether the
// object or array is empty: then it steps over its end too ('}' or ']').
func (s *Scanner) Open(end byte) (empty bool) {
	s.Pos++
	s.SkipSpace()
	return s.Consume(end)
}

// Colon reads the ':' after a member's name, and the white space around it.
func (s *Scanner) Colon() Fault {
	s.SkipSpace()
	if !s.Consume(':') {
		return syntax("':' after a field name")
	}
	s.SkipSpace()
	return Fault{}
}

// Next reads what follows a member's value in an object (end '}') or an element in an array
// (end ']'): white space, then end, and more is false; or ',' and the white space after it,
// and more is true.
func (s *Scanner) Next(end byte) (more bool, f Fault) {
	s.SkipSpace()
	if s.Consume(end) {
		return false, Fault{}
	}
	if !s.Consume(',') {
		if end == ']' {
			return false, syntax("',' or ']' after a value")
		}
		return false, syntax("',' or '}' after a value")
	}
	s.SkipSpace()
	return true, Fault{}
}

// Digits steps over decimal digits and reports whether there was one.
func (s *Scanner) Digits() bool {
	start := s.Pos
	for s.Pos < len(s.Data) && s.Data[s.Pos] >= '0' && s.Data[s.Pos] <= '9' {
		s.Pos++
	}
	return s.Pos > start
}

// Number reads a JSON number, -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and reports
// whether it is an integer: it has neither fraction nor exponent. Only the digits that the form
// allows are read: of 01, 0.
func (s *Scanner) Number() (integer bool, f Fault) {
	s.Consume('-')
	switch {
	case s.Consume('0'):
	case s.Pos < len(s.Data) && s.Data[s.Pos] >= '1' && s.Data[s.Pos] <= '9':
		s.Digits()
	default:
		return false, syntax("a digit")
	}
	integer = true
	if s.Consume('.') {
		integer = false
		if !s.Digits() {
			return false, syntax("a digit after '.'")
		}
	}
	if s.Consume('e') || s.Consume('E') {
		integer = false
		if !s.Consume('+') {
			s.Consume('-')
		}
		if !s.Digits() {
			return false, syntax("a digit in the exponent")
		}
	}
	return integer, Fault{}
}

// Surrogates says what String makes of an escaped lone surrogate (\ud800 not followed by an
// escaped low surrogate, or \udc00 alone), which encodes no character.
type Surrogates bool

const (
	// Strict refuses a lone surrogate: NotUTF8, as it decodes to no valid UTF-8.
	Strict Surrogates = false
	// Replace decodes a lone surrogate to U+FFFD, as encoding/json does.
	Replace Surrogates = true
)

// String reads the string at Pos and returns its contents decoded: a slice of Data when it holds
// no escape, else dst[:0] with the string appended (dst is scratch space; it grows past its
// capacity only for a longer string). A string of more than limit bytes once decoded is
// TooLong, one that is not valid UTF-8 NotUTF8; what a lone surrogate is, lone says; another
// value is NotString, Pos left at it. Faults are reported as the string is read: a fault later
// in a string that is already too long, or that holds a refused lone surrogate, is not reported.
func (s *Scanner) String(dst []byte, limit int, lone Surrogates) ([]byte, Fault) {
	if !s.Consume('"') {
		if s.Pos < len(s.Data) {
			if c := s.Data[s.Pos]; c == '{' || c == '[' || c == '-' || c == 't' || c == 'f' || c == 'n' || (c >= '0' && c <= '9') {
				return nil, Fault{Kind: NotString}
			}
		}
		return nil, syntax("a string")
	}
	start := s.Pos
	// Fast path: no escape, so the string is a slice of Data.
	for s.Pos < len(s.Data) {
		c := s.Data[s.Pos]
		if c == '"' {
			s.Pos++
			return whole(s.Data[start:s.Pos-1], limit)
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return nil, syntax("no control character in a string")
		}
		s.Pos++
	}
	if s.Pos >= len(s.Data) {
		return nil, syntax("the end of a string")
	}
	out := append(dst[:0], s.Data[start:s.Pos]...)
	for {
		if s.Pos >= len(s.Data) {
			return nil, syntax("the end of a string")
		}
		c := s.Data[s.Pos]
		switch {
		case c == '"':
			s.Pos++
			// Each escape appends whole valid UTF-8, which no byte before it can complete, so
			// out is valid exactly when the unescaped runs of the string are.
			return whole(out, limit)
		case c < 0x20:
			return nil, syntax("no control character in a string")
		case c != '\\':
			out = append(out, c)
			s.Pos++
		default:
			s.Pos++
			if s.Pos >= len(s.Data) {
				return nil, syntax("an escape")
			}
			e := s.Data[s.Pos]
			s.Pos++
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
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
				r, ok := s.hex4()
				if !ok {
					return nil, syntax("4 hex digits after \\u")
				}
				if utf16.IsSurrogate(r) {
					var f Fault
					if r, f = s.pair(r, lone); f.Failed() {
						return nil, f
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				return nil, syntax("a valid escape")
			}
		}
		if len(out) > limit {
			return nil, Fault{Kind: TooLong}
		}
	}
}

// whole checks the contents b of a string read to its end.
func whole(b []byte, limit int) ([]byte, Fault) {
	if len(b) > limit {
		return nil, Fault{Kind: TooLong}
	}
	if !utf8.Valid(b) {
		return nil, Fault{Kind: NotUTF8}
	}
	return b, Fault{}
}

// StringInPlace is String decoding an escaped string over its own bytes in Data, which keep the
// decoded string from then on: it allocates nothing, whatever the string. An escape never
// decodes to more bytes than it takes, so the decoded string starts where the string's contents
// did, after its opening quote, and ends no later than they did.
func (s *Scanner) StringInPlace(limit int, lone Surrogates) ([]byte, Fault) {
	if s.Pos >= len(s.Data) {
		return nil, syntax("a string")
	}
	return s.String(s.Data[s.Pos+1:s.Pos+1], limit, lone)
}

// pair decodes the surrogate r of the escape just read with the escaped low surrogate after it.
// Without one, r is a lone surrogate: NotUTF8 when lone is Strict, else U+FFFD, and the escape
// after it, if any, is left to be read on its own.
func (s *Scanner) pair(r rune, lone Surrogates) (rune, Fault) {
	if len(s.Data)-s.Pos >= 2 && s.Data[s.Pos] == '\\' && s.Data[s.Pos+1] == 'u' {
		next := s.Pos
		s.Pos += 2
		lo, ok := s.hex4()
		if !ok {
			return 0, syntax("4 hex digits after \\u")
		}
		if d := utf16.DecodeRune(r, lo); d != utf8.RuneError {
			return d, Fault{}
		}
		if lone == Replace {
			s.Pos = next
		}
	}
	if lone == Strict {
		return 0, Fault{Kind: NotUTF8}
	}
	return utf8.RuneError, Fault{}
}

// hex4 reads the four hex digits of a \u escape.
func (s *Scanner) hex4() (rune, bool) {
	if len(s.Data)-s.Pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s.Data[s.Pos : s.Pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	s.Pos += 4
	return r, true
}

// SkipString steps over the string at Pos ('"'), checking its form only: no control character,
// valid escapes. Its bytes need not be valid UTF-8, nor its surrogates paired: a caller that
// keeps a string reads it with String.
func (s *Scanner) SkipString() Fault {
	s.Pos++ // the opening quote
	for s.Pos < len(s.Data) {
		c := s.Data[s.Pos]
		switch {
		case c == '"':
			s.Pos++
			return Fault{}
		case c < 0x20:
			return syntax("no control character in a string")
		case c == '\\':
			s.Pos++
			if s.Pos >= len(s.Data) {
				return syntax("an escape")
			}
			e := s.Data[s.Pos]
			s.Pos++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := s.hex4(); !ok {
					return syntax("4 hex digits after \\u")
				}
			default:
				return syntax("a valid escape")
			}
		default:
			s.Pos++
		}
	}
	return syntax("the end of a string")
}

// Skip steps over white space and the well-formed JSON value after it, of any type, nested at
// most maxDepth deep (the value itself is at depth 1: a scalar or an empty object). Its strings
// are read as SkipString reads them. The depth bounds Skip's recursion, and so its stack.
func (s *Scanner) Skip(maxDepth int) Fault {
	return s.skip(1, maxDepth)
}

func (s *Scanner) skip(depth, maxDepth int) Fault {
	if depth > maxDepth {
		return Fault{Kind: TooDeep}
	}
	s.SkipSpace()
	if s.Pos >= len(s.Data) {
		return syntax("a value")
	}
	switch c := s.Data[s.Pos]; {
	case c == '"':
		return s.SkipString()
	case c == '{':
		if s.Open('}') {
			return Fault{}
		}
		for {
			if s.Pos >= len(s.Data) || s.Data[s.Pos] != '"' {
				return syntax("a field name")
			}
			if f := s.SkipString(); f.Failed() {
				return f
			}
			if f := s.Colon(); f.Failed() {
				return f
			}
			if f := s.skip(depth+1, maxDepth); f.Failed() {
				return f
			}
			if more, f := s.Next('}'); !more {
				return f
			}
		}
	case c == '[':
		if s.Open(']') {
			return Fault{}
		}
		for {
			if f := s.skip(depth+1, maxDepth); f.Failed() {
				return f
			}
			if more, f := s.Next(']'); !more {
				return f
			}
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, f := s.Number()
		return f
	}
	return syntax("a value")
}

func (s *Scanner) literal(lit string) Fault {
	if !s.Literal(lit) {
		return syntax(lit)
	}
	return Fault{}
}
