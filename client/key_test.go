package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/limiterd/server"
)

// binaryKeys are distinct keys that are not UTF-8: JSON would turn each into "u\uFFFD".
var binaryKeys = []string{"u\xff", "u\xfe", "u\x80"}

// countingLimiterd serves limiterd's real decisions API for a policy file, as startLimiterd
// does, and counts the requests that reach it.
func countingLimiterd(t *testing.T, policies string) (*client.Client, *atomic.Int64) {
	t.Helper()
	var sent atomic.Int64
	decisions := server.NewDecisions(newEngine(t, policies), nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		decisions.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c, &sent
}

// The measurement: three keys that are not UTF-8 shared one budget of 2, the third
// rejected by what the other two spent. Each is refused by the client, with an error that is
// not Unavailable (so the middleware fails closed), and nothing is sent.
func TestKeyNotUTF8IsRefused(t *testing.T) {
	c, sent := countingLimiterd(t, apiPolicy)
	for _, key := range binaryKeys {
		for name, call := range map[string]func() (client.Decision, error){
			"Allow":  func() (client.Decision, error) { return c.Allow(t.Context(), key) },
			"AllowN": func() (client.Decision, error) { return c.AllowN(t.Context(), key, 1) },
			"Peek":   func() (client.Decision, error) { return c.Peek(t.Context(), key) },
		} {
			d, err := call()
			switch {
			case err == nil:
				t.Errorf("%s(%q) = %+v, want it refused (limiterd decided it as %q)", name, key, d, "u\uFFFD")
			case !errors.Is(err, client.ErrKeyNotUTF8):
				t.Errorf("%s(%q): %v, want client.ErrKeyNotUTF8", name, key, err)
			case client.Unavailable(err):
				t.Errorf("%s(%q): %v is Unavailable: a caller would fail open", name, key, err)
			case strings.Contains(err.Error(), key):
				t.Errorf("%s(%q): %q carries the key", name, key, err)
			}
		}
	}
	if n := sent.Load(); n != 0 {
		t.Errorf("%d requests reached limiterd, want none", n)
	}
	// A key that is UTF-8 (U+FFFD itself included) is still decided, on its own budget.
	for _, key := range []string{"u\uFFFD", "u\uFFFD", "u\u00ff"} {
		if d, err := c.Allow(t.Context(), key); err != nil || !d.Allowed {
			t.Errorf("Allow(%q) = %+v, %v; want admitted", key, d, err)
		}
	}
}

// A batch refuses an item whose key is not UTF-8 on its own (its Result.Err), as limiterd
// refuses an invalid item, and sends the others; a batch of such items alone sends nothing.
func TestAllowBatchKeyNotUTF8(t *testing.T) {
	c, sent := countingLimiterd(t, apiPolicy)
	items := []client.BatchItem{{Key: "alice", Cost: 1}}
	for _, key := range binaryKeys {
		items = append(items, client.BatchItem{Key: key, Cost: 1})
	}
	items = append(items, client.BatchItem{Key: "alice", Cost: 1}, client.BatchItem{Key: "alice", Cost: 1})
	results, err := c.AllowBatch(t.Context(), items)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(items) {
		t.Fatalf("%d results for %d items", len(results), len(items))
	}
	for i, r := range results {
		switch it := items[i]; {
		case !utf8.ValidString(it.Key):
			if !errors.Is(r.Err, client.ErrKeyNotUTF8) || client.Unavailable(r.Err) {
				t.Errorf("item %d (%q): %+v %v, want client.ErrKeyNotUTF8", i, it.Key, r.Decision, r.Err)
			}
		case r.Err != nil:
			t.Errorf("item %d (%q): %v", i, it.Key, r.Err)
		}
	}
	// alice's items are decided in order around the refused ones: 2 admitted, then rejected.
	if !results[0].Allowed || !results[4].Allowed || results[5].Allowed || results[5].Err != nil {
		t.Errorf("alice: %+v, %+v, %+v", results[0], results[4], results[5])
	}
	if n := sent.Load(); n != 1 {
		t.Errorf("%d requests reached limiterd, want 1", n)
	}

	only := make([]client.BatchItem, len(binaryKeys))
	for i, key := range binaryKeys {
		only[i] = client.BatchItem{Key: key, Cost: 1}
	}
	results, err = c.AllowBatch(t.Context(), only)
	if err != nil || len(results) != len(only) {
		t.Fatalf("a batch of keys that are not UTF-8: %v %v", results, err)
	}
	for i, r := range results {
		if !errors.Is(r.Err, client.ErrKeyNotUTF8) {
			t.Errorf("item %d (%q): %+v %v, want client.ErrKeyNotUTF8", i, only[i].Key, r.Decision, r.Err)
		}
	}
	if n := sent.Load(); n != 1 {
		t.Errorf("%d requests reached limiterd, want still 1", n)
	}
}

// FuzzKeyRoundTrip sends a key as AllowN and as an item of AllowBatch to a server that decodes
// the request with limiterd's own decoders: a key that is UTF-8 arrives exactly as it was
// given, and one that is not is refused with ErrKeyNotUTF8 and never sent.
func FuzzKeyRoundTrip(f *testing.F) {
	for _, seed := range []string{"alice", "u\uFFFD", "u\xff", "\x00\x1f\"\\</>&\u2028\u2029", "ip:2001:db8::/64",
		"\xed\xa0\x80", "\xf4\x90\x80\x80", "日本語", "a\xc3", "sha256:" + strings.Repeat("0", 64)} {
		f.Add(seed)
	}
	var got atomic.Pointer[string]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, `{"error":"read"}`, http.StatusInternalServerError)
			return
		}
		var key string
		if strings.HasSuffix(r.URL.Path, ":batch") {
			items, err := server.DecodeBatchRequest(body, nil)
			if err != nil || len(items) != 1 || items[0].Err != nil {
				http.Error(w, `{"error":"batch"}`, http.StatusBadRequest)
				return
			}
			key = items[0].Key
			_, _ = w.Write([]byte(`{"results":[{"allowed":true}]}`))
		} else {
			req, err := server.DecodeAllowRequest(body)
			if err != nil {
				http.Error(w, `{"error":"single"}`, http.StatusBadRequest)
				return
			}
			key = req.Key
			_, _ = w.Write([]byte(`{"allowed":true}`))
		}
		got.Store(&key)
	}))
	f.Cleanup(srv.Close)
	c, err := client.New(srv.URL)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if key == "" {
			return // limiterd requires a key
		}
		for _, batch := range []bool{false, true} {
			got.Store(nil)
			var err error
			if batch {
				var results []client.Result
				results, err = c.AllowBatch(context.Background(), []client.BatchItem{{Key: key, Cost: 1}})
				if err == nil && len(results) == 1 {
					err = results[0].Err
				}
			} else {
				_, err = c.AllowN(context.Background(), key, 1)
			}
			sent := got.Load()
			if !utf8.ValidString(key) {
				if !errors.Is(err, client.ErrKeyNotUTF8) || sent != nil {
					t.Fatalf("%q (batch %t): %v, sent: %t; want ErrKeyNotUTF8 and nothing sent", key, batch, err, sent != nil)
				}
				continue
			}
			if err != nil || sent == nil || *sent != key {
				read := "nothing"
				if sent != nil {
					read = fmt.Sprintf("%q", *sent)
				}
				t.Fatalf("%q (batch %t): %v; limiterd read %s", key, batch, err, read)
			}
		}
	})
}
