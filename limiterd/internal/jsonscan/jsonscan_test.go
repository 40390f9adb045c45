package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// stringCase is a string String reads: its decoded contents, or its fault; and where it stops.
type stringCase struct {
	in     string
	limit  int
	lone   Surrogates
	want   string
	fault  Fault
	endPos int // Pos after the call: the string's end, or where the fault is
}

var stringCases = []stringCase{
	{`"abc"x`, 10, Strict, "abc", Fault{}, 5},
	{`""`, 0, Strict, "", Fault{}, 2},
	{`"a\"b\\c\/d\b\f\n\r\t"`, 20, Strict, "a\"b\\c/d\b\f\n\r\t", Fault{}, 22},
	{`"\u00e9\u4E2D\ud83d\ude00"`, 20, Strict, "é中😀", Fault{}, 26},
	{`"é中😀"`, 20, Strict, "é中😀", Fault{}, 11},
	{`"\ud800"`, 20, Strict, "", Fault{Kind: NotUTF8}, 7},
	{`"\ud800"`, 20, Replace, "\uFFFD", Fault{}, 8},
	{`"\udc00"`, 20, Strict, "", Fault{Kind: NotUTF8}, 7},
	{`"\ud800\u0041"`, 20, Strict, "", Fault{Kind: NotUTF8}, 13},
	{`"\ud800\u0041"`, 20, Replace, "\uFFFDA", Fault{}, 14},
	{`"\ud800\n"`, 20, Replace, "\uFFFD\n", Fault{}, 10},
	{`"\udc00\ud800\udc00"`, 20, Replace, "\uFFFD\U00010000", Fault{}, 20},
	{`"\ud800\ud800\udc00"`, 20, Replace, "\uFFFD\U00010000", Fault{}, 20},
	{`"\ud800\u12"`, 20, Replace, "", syntax(`4 hex digits after \u`), 9},
	{`"\u12"`, 20, Strict, "", syntax(`4 hex digits after \u`), 3},
	{`"\uzzzz"`, 20, Strict, "", syntax(`4 hex digits after \u`), 3},
	{`"\x"`, 20, Strict, "", syntax("a valid escape"), 3},
	{`"a` + "\x01" + `"`, 20, Strict, "", syntax("no control character in a string"), 2},
	{`"\n` + "\x01" + `"`, 20, Strict, "", syntax("no control character in a string"), 3},
	{`"abc`, 20, Strict, "", syntax("the end of a string"), 4},
	{`"\n`, 20, Strict, "", syntax("the end of a string"), 3},
	{`"\`, 20, Strict, "", syntax("an escape"), 2},
	{`x`, 20, Strict, "", syntax("a string"), 0},
	{``, 20, Strict, "", syntax("a string"), 0},
	{`}`, 20, Strict, "", syntax("a string"), 0},
	{`5`, 20, Strict, "", Fault{Kind: NotString}, 0},
	{`-`, 20, Strict, "", Fault{Kind: NotString}, 0},
	{`{}`, 20, Strict, "", Fault{Kind: NotString}, 0},
	{`[`, 20, Strict, "", Fault{Kind: NotString}, 0},
	{`nul`, 20, Strict, "", Fault{Kind: NotString}, 0},
	{`true`, 20, Strict, "", Fault{Kind: NotString}, 0},
	{`f`, 20, Strict, "", Fault{Kind: NotString}, 0},
	{"\"\xff\"", 20, Strict, "", Fault{Kind: NotUTF8}, 3},
	{"\"\\n\xff\"", 20, Replace, "", Fault{Kind: NotUTF8}, 5},
	{"\"\xc3\\u00a9\"", 20, Replace, "", Fault{Kind: NotUTF8}, 9}, // a lead byte no escape completes
	{`"abcd"`, 3, Strict, "", Fault{Kind: TooLong}, 6},
	{`"abc"`, 3, Strict, "abc", Fault{}, 5},
	// Too long is told as soon as it is: before a later syntax fault, once past an escape.
	{`"\nabc\x"`, 3, Strict, "", Fault{Kind: TooLong}, 6},
	{`"\u00e9\u00e9"`, 3, Strict, "", Fault{Kind: TooLong}, 13},
}

func TestString(t *testing.T) {
	for _, tc := range stringCases {
		for _, inPlace := range []bool{false, true} {
			data := []byte(tc.in)
			s := Scanner{Data: data}
			var got []byte
			var f Fault
			if inPlace {
				got, f = s.StringInPlace(tc.limit, tc.lone)
			} else {
				got, f = s.String(make([]byte, 0, 1), tc.limit, tc.lone)
			}
			if string(got) != tc.want || f != tc.fault || s.Pos != tc.endPos {
				t.Errorf("%q in place %v: %q %+v at %d, want %q %+v at %d", tc.in, inPlace, got, f, s.Pos, tc.want, tc.fault, tc.endPos)
			}
			if inPlace && !f.Failed() && !bytes.HasPrefix(data[1:], got) {
				t.Errorf("%q: decoded %q, not in place: %q", tc.in, got, data)
			}
		}
	}
}

// numberCases are numbers Number reads, whether each is an integer, and where it stops.
var numberCases = []struct {
	in      string
	integer bool
	fault   Fault
	endPos  int
}{
	{"0", true, Fault{}, 1},
	{"-0", true, Fault{}, 2},
	{"01", true, Fault{}, 1}, // 0, then 1 is the caller's
	{"1234567890123456789012,", true, Fault{}, 22},
	{"-1.5e+10]", false, Fault{}, 8},
	{"1E2", false, Fault{}, 3},
	{"0.0", false, Fault{}, 3},
	{"1.", false, syntax("a digit after '.'"), 2},
	{"1.e5", false, syntax("a digit after '.'"), 2},
	{"1e", false, syntax("a digit in the exponent"), 2},
	{"1e+", false, syntax("a digit in the exponent"), 3},
	{"-", false, syntax("a digit"), 1},
	{"-a", false, syntax("a digit"), 1},
	{"+1", false, syntax("a digit"), 0},
	{".5", false, syntax("a digit"), 0},
}

func TestNumber(t *testing.T) {
	for _, tc := range numberCases {
		s := Scanner{Data: []byte(tc.in)}
		integer, f := s.Number()
		if integer != tc.integer || f != tc.fault || s.Pos != tc.endPos {
			t.Errorf("%q: %v %+v at %d, want %v %+v at %d", tc.in, integer, f, s.Pos, tc.integer, tc.fault, tc.endPos)
		}
	}
}

// skipCases are values Skip reads within a depth, and where it stops.
var skipCases = []struct {
	in       string
	maxDepth int
	fault    Fault
	endPos   int
}{
	{` {"a" : [1, -2.5e3, "x", true, false, null, {}, []], "b":{"c":"\ud800"}} x`, 3, Fault{}, 72},
	{`[[[]]]`, 3, Fault{}, 6},
	{`[[[]]]`, 2, Fault{Kind: TooDeep}, 2},
	{`{"a":{"b":1}}`, 3, Fault{}, 13},
	{`{"a":{"b":1}}`, 2, Fault{Kind: TooDeep}, 10},
	{`{"a":{"b":1}}`, 1, Fault{Kind: TooDeep}, 5},
	{`5`, 0, Fault{Kind: TooDeep}, 0},
	{"\"\xff\"", 1, Fault{}, 3}, // SkipString leaves UTF-8 to the caller
	{``, 1, syntax("a value"), 0},
	{` }`, 1, syntax("a value"), 1},
	{`{"a" 1}`, 2, syntax("':' after a field name"), 5},
	{`{"a":1 "b":2}`, 2, syntax("',' or '}' after a value"), 7},
	{`{"a":1,}`, 2, syntax("a field name"), 7},
	{`{a:1}`, 2, syntax("a field name"), 1},
	{`[1 2]`, 2, syntax("',' or ']' after a value"), 3},
	{`[1,]`, 2, syntax("a value"), 3},
	{`[`, 2, syntax("a value"), 1},
	{`tru`, 1, syntax("true"), 0},
	{`nul`, 1, syntax("null"), 0},
	{`fals`, 1, syntax("false"), 0},
	{`01`, 1, Fault{}, 1},
	{`-`, 1, syntax("a digit"), 1},
	{`"\q"`, 1, syntax("a valid escape"), 3},
	{`"\u00"`, 1, syntax(`4 hex digits after \u`), 3},
	{`"a`, 1, syntax("the end of a string"), 2},
	{`"\`, 1, syntax("an escape"), 2},
	{"\"\x1f\"", 1, syntax("no control character in a string"), 1},
}

func TestSkip(t *testing.T) {
	for _, tc := range skipCases {
		s := Scanner{Data: []byte(tc.in)}
		if f := s.Skip(tc.maxDepth); f != tc.fault || s.Pos != tc.endPos {
			t.Errorf("%q depth %d: %+v at %d, want %+v at %d", tc.in, tc.maxDepth, f, s.Pos, tc.fault, tc.endPos)
		}
	}
}

func TestNextAndColon(t *testing.T) {
	s := Scanner{Data: []byte(" , x ] } : y")}
	if more, f := s.Next('}'); !more || f.Failed() || s.Pos != 3 {
		t.Fatalf("',': %v %+v at %d, want more at 3", more, f, s.Pos)
	}
	if more, f := s.Next(']'); more || f != syntax("',' or ']' after a value") || s.Pos != 3 {
		t.Fatalf("'x': %v %+v at %d", more, f, s.Pos)
	}
	s.Pos = 4
	if more, f := s.Next(']'); more || f.Failed() || s.Pos != 6 {
		t.Fatalf("']': %v %+v at %d, want the end at 6", more, f, s.Pos)
	}
	if more, f := s.Next('}'); more || f.Failed() || s.Pos != 8 {
		t.Fatalf("'}': %v %+v at %d, want the end at 8", more, f, s.Pos)
	}
	if f := s.Colon(); f.Failed() || s.Pos != 11 {
		t.Fatalf("':': %+v at %d, want 11", f, s.Pos)
	}
	if f := s.Colon(); f != syntax("':' after a field name") || s.Pos != 11 {
		t.Fatalf("'y': %+v at %d", f, s.Pos)
	}
}

// FuzzString holds String, StringInPlace and SkipString to encoding/json: a string String
// decodes (either way with lone surrogates) is one encoding/json decodes to the same, and a
// valid JSON string in valid UTF-8 is one String decodes whole; SkipString reads the same
// strings, and any well-formed string in invalid UTF-8 too.
func FuzzString(f *testing.F) {
	for _, seed := range []string{
		`"abc"`, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u00e9\u4E2D\ud83d\ude00"`, `"\ud800"`, `"\udc00\ud800\udc00"`,
		`"\ud800\u0041"`, `"\ud800\u12"`, `"\x"`, "\"\x01\"", `"abc`, "\"\xff\"", "\"\xc3\\u00a9\"", `"" `, `x`,
	} {
		f.Add([]byte(seed), 64)
	}
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		if limit < 0 || limit > len(data) {
			limit = len(data)
		}
		valid := json.Valid(data) && len(data) > 0 && data[0] == '"'
		var std string
		if valid && json.Unmarshal(data, &std) != nil {
			t.Fatalf("json.Valid(%q), but encoding/json does not decode it", data)
		}

		skip := Scanner{Data: data}
		skipped := false
		if len(data) > 0 && data[0] == '"' {
			f := skip.SkipString()
			skipped = !f.Failed()
			if valid && (!skipped || skip.Pos != len(bytes.TrimRight(data, space))) {
				t.Fatalf("SkipString(%q): %+v at %d; encoding/json reads it whole", data, f, skip.Pos)
			}
		}

		var decoded [2][]byte // Strict, Replace
		for i, lone := range []Surrogates{Strict, Replace} {
			s := Scanner{Data: data}
			got, f := s.String(nil, limit, lone)
			in := Scanner{Data: bytes.Clone(data)}
			gotInPlace, fInPlace := in.StringInPlace(limit, lone)
			if string(got) != string(gotInPlace) || f != fInPlace || s.Pos != in.Pos {
				t.Fatalf("%q: String %q %+v at %d, in place %q %+v at %d", data, got, f, s.Pos, gotInPlace, fInPlace, in.Pos)
			}
			if f.Failed() {
				if valid && utf8.Valid(data) && (lone == Replace || !strings.Contains(strings.ToLower(string(data)), `\ud`)) &&
					!(f.Kind == TooLong && len(std) > limit) {
					t.Fatalf("%q (limit %d, lone %v): %+v, but encoding/json decodes %q", data, limit, lone, f, std)
				}
				continue
			}
			decoded[i] = got
			if len(got) > limit || !utf8.Valid(got) {
				t.Fatalf("%q: decoded %q, limit %d", data, got, limit)
			}
			if !in.hasAt(1, gotInPlace) {
				t.Fatalf("%q: decoded %q, not in place: %q", data, gotInPlace, in.Data)
			}
			lit := data[:s.Pos]
			var want string
			if err := json.Unmarshal(lit, &want); err != nil || want != string(got) {
				t.Fatalf("%q: decoded %q, encoding/json decodes %q to %q, %v", data, got, lit, want, err)
			}
			if !skipped || skip.Pos != s.Pos {
				t.Fatalf("%q: String read %d bytes, SkipString %d (%v)", data, s.Pos, skip.Pos, skipped)
			}
		}
		if decoded[0] != nil && string(decoded[0]) != string(decoded[1]) {
			t.Fatalf("%q: Strict %q, Replace %q", data, decoded[0], decoded[1])
		}
	})
}

// space is JSON's white space.
const space = " \t\r\n"

// hasAt reports whether s.Data holds b at i.
func (s *Scanner) hasAt(i int, b []byte) bool {
	return i+len(b) <= len(s.Data) && bytes.Equal(s.Data[i:i+len(b)], b)
}

// FuzzNumber holds Number to encoding/json: the number it reads is valid JSON, an integer when
// it has neither '.' nor an exponent, and a valid JSON number is read whole.
func FuzzNumber(f *testing.F) {
	for _, seed := range []string{"0", "-0", "01", "-1.5e+10", "1.", "1e", "-", ".5", "123", "1E2"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := Scanner{Data: data}
		integer, f := s.Number()
		data = bytes.TrimRight(data, space)
		isNumber := len(data) > 0 && (data[0] == '-' || '0' <= data[0] && data[0] <= '9') && json.Valid(data)
		if f.Failed() {
			if isNumber {
				t.Fatalf("%q: %+v at %d; encoding/json reads a number", data, f, s.Pos)
			}
			return
		}
		lit := data[:s.Pos]
		var n json.Number
		if err := json.Unmarshal(lit, &n); err != nil || n.String() != string(lit) {
			t.Fatalf("%q: read %q, encoding/json says %q %v", data, lit, n, err)
		}
		if integer != !bytes.ContainsAny(lit, ".eE") {
			t.Fatalf("%q: integer %v", lit, integer)
		}
		if isNumber && s.Pos != len(data) {
			t.Fatalf("%q: read %q of a number", data, lit)
		}
	})
}

// FuzzSkip holds Skip to encoding/json: what it reads is one well-formed JSON value, a
// well-formed value (white space around it) is read whole, and it is refused as too deep
// only when nested deeper than the limit.
func FuzzSkip(f *testing.F) {
	for _, seed := range []string{
		` {"a" : [1, -2.5e3, "x", true, false, null, {}, []], "b":{"c":"\ud800"}} `, `[[[]]]`, `{"a" 1}`,
		`{"a":1,}`, `[1,]`, `tru`, `01`, "\"\xff\"", `{"a":{"b":[{"c":null}]}}`, "\t\n\r 5 ",
	} {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, maxDepth uint8) {
		s := Scanner{Data: data}
		fault := s.Skip(int(maxDepth))
		rest := data[s.Pos:]
		// json.Valid checks the form alone, not UTF-8, as Skip does.
		valid := json.Valid(data)
		depth, _ := depthOf(data)
		switch {
		case fault.Kind == TooDeep:
			// Skip stops where a value would start below maxDepth open objects and arrays.
			if _, open := depthOf(data[:s.Pos]); open != int(maxDepth) || valid && depth <= int(maxDepth) {
				t.Fatalf("%q: too deep for %d at %d (%d open there); valid %v, depth %d", data, maxDepth, s.Pos, open, valid, depth)
			}
		case fault.Failed():
			if valid && depth <= int(maxDepth) {
				t.Fatalf("%q: %+v at %d, but it is valid JSON of depth %d", data, fault, s.Pos, depth)
			}
		default:
			if !json.Valid(data[:s.Pos]) {
				t.Fatalf("%q: read %q, which encoding/json refuses", data, data[:s.Pos])
			}
			if valid && len(bytes.Trim(rest, space)) != 0 {
				t.Fatalf("%q: read %q of a valid value", data, data[:s.Pos])
			}
		}
	})
}

// depthOf reads data with encoding/json's tokenizer: deepest is the nesting depth of the
// value, as Skip counts it (a scalar is 1), and open how many objects and arrays are open
// where it stops: the end of data, or what it cannot read.
func depthOf(data []byte) (deepest, open int) {
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest, open
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			open++
			deepest = max(deepest, open)
		case json.Delim('}'), json.Delim(']'):
			open--
		default:
			deepest = max(deepest, open+1)
		}
	}
}
