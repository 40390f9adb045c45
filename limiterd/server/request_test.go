package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDecodeAllowRequest(t *testing.T) {
	for _, tc := range []struct {
		body string
		want AllowRequest
	}{
		{`{"key":"k"}`, AllowRequest{Key: "k", Cost: 1}},
		{` { "policy" : "ns/p" , "key" : "k" , "cost" : 7 } `, AllowRequest{Policy: "ns/p", Key: "k", Cost: 7}},
		{"{\n\t\"key\":\"k\",\r\n\"cost\":1000000000}", AllowRequest{Key: "k", Cost: 1_000_000_000}},
		{`{"policy":null,"key":"k","cost":null}`, AllowRequest{Key: "k", Cost: 1}},
		{`{"key":"a\"b\\c\/d\b\f\n\r\t"}`, AllowRequest{Key: "a\"b\\c/d\b\f\n\r\t", Cost: 1}},
		{`{"key":"\u00e9\u4e2d\ud83d\ude00"}`, AllowRequest{Key: "é中😀", Cost: 1}},
		{`{"key":"é中😀"}`, AllowRequest{Key: "é中😀", Cost: 1}},
		{`{"key":"k","cost":0}`, AllowRequest{Key: "k", Cost: 0}},
	} {
		got, err := DecodeAllowRequest([]byte(tc.body))
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.body, got, err, tc.want)
		}
	}
}

func TestDecodeAllowRequestRejects(t *testing.T) {
	for _, body := range []string{
		``, ` `, `null`, `[]`, `"k"`, `{`, `{"key"}`, `{"key":}`, `{"key":"k",}`, `{"key":"k" "cost":1}`,
		`{"key":"k"}x`, `{"key":"k"}{}`, `{key:"k"}`, `{'key':'k'}`,
		`{"Key":"k"}`, `{"key":"k","extra":1}`, `{"key":"k","key":"k"}`, `{"key":"k","cost":1,"cost":1}`,
		`{"key":"k","policy":"a","policy":"a"}`,
		`{"key":"\x"}`, `{"key":"\u12"}`, `{"key":"\ud800"}`, `{"key":"\ud800\u0041"}`, `{"key":"\udc00"}`,
		"{\"key\":\"a\x01\"}", "{\"key\":\"\xff\"}",
		`{"policy":"` + strings.Repeat("p", MaxPolicyBytes+1) + `","key":"k"}`,
		`{"key":"k","cost":00}`, `{"key":"k","cost":-0}`, `{"key":"k","cost":-5}`, `{"key":"k","cost":01}`,
		`{"key":"k","cost":1.0}`, `{"key":"k","cost":1e2}`, `{"key":"k","cost":1E2}`, `{"key":"k","cost":"1"}`,
		`{"key":"k","cost":1000000001}`, `{"key":"k","cost":18446744073709551617}`, `{"key":"k","cost":-}`,
		`{"key":"k","cost":true}`, `{"key":"k","cost":{}}`, `{"key":"k","policy":1}`, `{"key":"k","policy":{}}`,
		`{"key":null}`, `{"key":""}`, `{}`, `{"cost":1}`,
	} {
		got, err := DecodeAllowRequest([]byte(body))
		if err == nil {
			t.Errorf("%q: accepted as %+v", body, got)
			continue
		}
		var reqErr errRequest
		if !errors.As(err, &reqErr) || err.Error() == "" {
			t.Errorf("%q: error %v is not a client error", body, err)
		}
	}
}

func TestDecodeAllowQuery(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  AllowRequest
	}{
		{"key=k", AllowRequest{Key: "k", Cost: 1}},
		{"policy=ns%2Fp&key=a+b%20c&cost=42", AllowRequest{Policy: "ns/p", Key: "a b c", Cost: 42}},
		{"&key=k&&cost=1&", AllowRequest{Key: "k", Cost: 1}},
		{"key=%C3%A9", AllowRequest{Key: "é", Cost: 1}},
		{"key=k&cost=0", AllowRequest{Key: "k", Cost: 0}},
	} {
		got, err := DecodeAllowQuery(tc.query)
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.query, got, err, tc.want)
		}
	}
	for _, q := range []string{
		"", "cost=1", "key=", "key=k&key=k", "key=k&cost=00", "key=k&cost=-0", "key=k&cost=-1", "key=k&cost=1.5", "key=k&cost=",
		"key=k&cost=1e3", "key=k&cost=+1", "key=k&cost=1000000001", "key=k&x=1", "key=%zz", "key=%ff",
		"key=k&policy=a&policy=b",
	} {
		if got, err := DecodeAllowQuery(q); err == nil {
			t.Errorf("%q: accepted as %+v", q, got)
		}
	}
}

// FuzzDecodeAllowRequest checks the decoder against encoding/json: whatever it accepts is valid
// JSON that encoding/json decodes to the same request, and re-encoding that request decodes
// to it again. The decoder is stricter (exact field names, no duplicates, valid UTF-8, integer
// costs), so the converse does not hold.
func FuzzDecodeAllowRequest(f *testing.F) {
	for _, seed := range []string{
		`{"key":"k"}`, `{"policy":"default/api","key":"alice","cost":3}`, `{"key":"\u00e9\ud83d\ude00"}`,
		`{"key":"k","cost":1.5}`, `{"key":"k","cost":null,"policy":null}`, `{"key":"k","Key":"j"}`,
		` {"key" : "a\"b" } `, `{"key":"k"}{}`, `{"cost":1000000000,"key":"x"}`, `{"key":"k","cost":0}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := DecodeAllowRequest(body)
		if err != nil {
			var reqErr errRequest
			if !errors.As(err, &reqErr) {
				t.Fatalf("error %v is not a client error", err)
			}
			return
		}
		if got.Key == "" || len(got.Key) > len(body) || !utf8.ValidString(got.Key) {
			t.Fatalf("accepted key %q", got.Key)
		}
		if len(got.Policy) > MaxPolicyBytes || !utf8.ValidString(got.Policy) {
			t.Fatalf("accepted policy %q", got.Policy)
		}
		if got.Cost < 0 || got.Cost > MaxCost {
			t.Fatalf("accepted cost %d", got.Cost)
		}
		var std struct {
			Policy *string      `json:"policy"`
			Key    *string      `json:"key"`
			Cost   *json.Number `json:"cost"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		if err := dec.Decode(&std); err != nil {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		if dec.More() {
			t.Fatalf("accepted %q with trailing data", body)
		}
		if std.Key == nil || *std.Key != got.Key {
			t.Fatalf("key %q, encoding/json says %v", got.Key, std.Key)
		}
		if (std.Policy == nil && got.Policy != "") || (std.Policy != nil && *std.Policy != got.Policy) {
			t.Fatalf("policy %q, encoding/json says %v", got.Policy, std.Policy)
		}
		wantCost := int64(1)
		if std.Cost != nil {
			if wantCost, err = strconv.ParseInt(std.Cost.String(), 10, 64); err != nil {
				t.Fatalf("cost %d, encoding/json says %v", got.Cost, std.Cost)
			}
		}
		if got.Cost != wantCost {
			t.Fatalf("cost %d, encoding/json says %d", got.Cost, wantCost)
		}
		again, err := json.Marshal(map[string]any{"policy": got.Policy, "key": got.Key, "cost": got.Cost})
		if err != nil {
			t.Fatal(err)
		}
		if round, err := DecodeAllowRequest(again); err != nil || round != got {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, round, err, got)
		}
	})
}

// FuzzDecodeAllowQuery checks the query decoder against net/url: whatever it accepts, url
// parses to the same parameters.
func FuzzDecodeAllowQuery(f *testing.F) {
	for _, seed := range []string{"key=k", "policy=ns%2Fp&key=a+b&cost=42", "key=%zz", "key=k&cost=1.5", "&&key=%C3%A9&"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, query string) {
		got, err := DecodeAllowQuery(query)
		if err != nil {
			return
		}
		if got.Key == "" || len(got.Key) > len(query) || !utf8.ValidString(got.Key) || got.Cost < 0 || got.Cost > MaxCost {
			t.Fatalf("accepted %+v", got)
		}
		values, err := url.ParseQuery(query)
		if err != nil {
			if strings.Contains(query, ";") {
				return // net/url rejects semicolons; the decoder keeps them in values
			}
			t.Fatalf("accepted %q, which net/url rejects: %v", query, err)
		}
		if values.Get("key") != got.Key || values.Get("policy") != got.Policy {
			t.Fatalf("%+v, net/url says %v", got, values)
		}
		if c := values.Get("cost"); c != "" && c != strconv.FormatInt(got.Cost, 10) {
			t.Fatalf("cost %d, net/url says %q", got.Cost, c)
		}
	})
}
