package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

const leaseTimeoutForTests = time.Minute

// leaseEngine returns an engine on clock serving default/<name> for each name, whose tier
// "standard" is a stack of a token bucket "rate" of capacity tokens and a concurrency limit
// "inflight" of places, leased for leaseTimeoutForTests. The policy API's form of a concurrency
// limit is another change's: the stack is built in Go, on a tier compiled with two limits of
// those names.
func leaseEngine(t testing.TB, clock *testsupport.Clock, capacity, places int64, names ...string) *engine.Engine {
	t.Helper()
	var ps []*policy.Policy
	for _, name := range names {
		p, err := policy.Compile(newPolicy(name, testsupport.StackedTier("standard",
			testsupport.TokenBucketLimit("rate", capacity, 1, time.Hour), testsupport.TokenBucketLimit("inflight", places, 1, time.Hour))))
		if err != nil {
			t.Fatal(err)
		}
		tb, err := limiter.NewTokenBucket(capacity, 1, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := limiter.NewConcurrency(places, leaseTimeoutForTests)
		if err != nil {
			t.Fatal(err)
		}
		if p.Tiers[0].Stack, err = limiter.NewStack([]string{"rate", "inflight"}, []limiter.RateLimiter{tb, c}); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	set, err := policy.NewSet(ps...)
	if err != nil {
		t.Fatal(err)
	}
	e := engine.New(engine.Options{Clock: clock.Now})
	e.Swap(set)
	return e
}

// leaseAnswer is what an answer says of a lease.
type leaseAnswer struct {
	Lease          string    `json:"lease"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt"`
	LeaseTimeoutMs int64     `json:"leaseTimeoutMs"`
	Released       int64     `json:"released"`
	Extended       int64     `json:"extended"`
	Remaining      int64     `json:"remaining"`
}

func leaseOf(t testing.TB, a answer) leaseAnswer {
	t.Helper()
	var v leaseAnswer
	if err := json.Unmarshal([]byte(a.body), &v); err != nil {
		t.Fatalf("answer %d %q: %v", a.status, a.body, err)
	}
	if h := a.header.Get("Limiterd-Lease"); h != v.Lease {
		t.Fatalf("Limiterd-Lease %q, body's lease %q", h, v.Lease)
	}
	return v
}

func releaseOf(lease string, extend bool) string {
	b, _ := json.Marshal(map[string]any{"lease": lease, "extend": extend})
	return string(b)
}

// TestRelease: an admission on a tier with a concurrency limit answers its lease; /v1/release
// frees exactly its place, once; an extension answers a new lease a lease timeout from now.
func TestRelease(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(leaseEngine(t, clock, 100, 2, "api"), nil)
	allow := func() leaseAnswer {
		t.Helper()
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
		l := leaseOf(t, a)
		if (a.status == http.StatusOK) != (l.Lease != "") {
			t.Fatalf("allow: %d %s; want a lease exactly when admitted", a.status, a.body)
		}
		return l
	}
	first := allow()
	if first.Lease == "" || !first.LeaseExpiresAt.Equal(clock.Now().Add(time.Minute)) || first.LeaseTimeoutMs != 60000 {
		t.Fatalf("first lease: %+v", first)
	}
	if second := allow(); second.Lease == "" || second.Lease == first.Lease {
		t.Fatalf("second lease: %+v", second)
	}
	if third := allow(); third.Lease != "" {
		t.Fatal("a third request in flight admitted over the limit of 2")
	}

	a := serve(t, h, http.MethodPost, "/v1/release", releaseOf(first.Lease, false))
	if r := leaseOf(t, a); a.status != http.StatusOK || r.Released != 1 || r.Lease != "" || r.Remaining != 1 {
		t.Fatalf("release: %d %s", a.status, a.body)
	}
	third := allow()
	if third.Lease == "" {
		t.Fatal("the released place is not free")
	}
	if allow().Lease != "" {
		t.Fatal("a release freed more than one place")
	}
	if a := serve(t, h, http.MethodPost, "/v1/release", releaseOf(first.Lease, false)); a.status != http.StatusConflict {
		t.Fatalf("second release: %d %s, want 409", a.status, a.body)
	} else {
		a.errorText(t)
	}

	// Extend: a new lease, a lease timeout from now; the old one is spent.
	clock.Advance(30 * time.Second)
	a = serve(t, h, http.MethodPost, "/v1/release", `{"lease":"`+third.Lease+`","extend":true}`)
	ext := leaseOf(t, a)
	if a.status != http.StatusOK || ext.Extended != 1 || ext.Released != 0 || ext.Lease == "" || ext.Lease == third.Lease ||
		!ext.LeaseExpiresAt.Equal(clock.Now().Add(time.Minute)) || ext.LeaseTimeoutMs != 60000 {
		t.Fatalf("extension: %d %s", a.status, a.body)
	}
	if a := serve(t, h, http.MethodPost, "/v1/release", releaseOf(third.Lease, true)); a.status != http.StatusConflict {
		t.Fatalf("extension of a spent lease: %d %s, want 409", a.status, a.body)
	}

	// A forged lease: a bit of its decoded bytes flipped.
	raw, err := base64.RawURLEncoding.DecodeString(ext.Lease)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 1
	forged := base64.RawURLEncoding.EncodeToString(raw)
	if a := serve(t, h, http.MethodPost, "/v1/release", releaseOf(forged, false)); a.status != http.StatusForbidden {
		t.Fatalf("forged lease: %d %s, want 403", a.status, a.body)
	}
	for name, body := range map[string]string{
		"no lease":       `{"extend":true}`,
		"not a lease":    releaseOf("!", false),
		"a timeout":      `{"lease":"` + ext.Lease + `","extend":true,"leaseTimeout":"24h"}`,
		"extend string":  `{"lease":"` + ext.Lease + `","extend":"yes"}`,
		"unknown field":  `{"lease":"` + ext.Lease + `","places":1}`,
		"not an object":  `[]`,
		"trailing bytes": `{"lease":"` + ext.Lease + `"}{}`,
	} {
		if a := serve(t, h, http.MethodPost, "/v1/release", body); a.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", name, a.status, a.body)
		}
	}
	if a := serve(t, h, http.MethodGet, "/v1/release", ""); a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != "POST" {
		t.Errorf("GET: %d %v", a.status, a.header)
	}
	// Nothing of that changed the leases: alice holds 2 places (the second lease's and the
	// extended one's); and the releases gave no rate back (3 admissions of 100).
	a = serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice","cost":0}`)
	var peek struct {
		Limits []struct {
			Remaining int64 `json:"remaining"`
		} `json:"limits"`
	}
	if err := json.Unmarshal([]byte(a.body), &peek); err != nil || len(peek.Limits) != 2 ||
		peek.Limits[0].Remaining != 97 || peek.Limits[1].Remaining != 0 {
		t.Fatalf("peek: %s; want 97 of the rate and 0 places left", a.body)
	}
	clock.Advance(time.Minute)
	if a := serve(t, h, http.MethodPost, "/v1/release", releaseOf(ext.Lease, false)); a.status != http.StatusGone {
		t.Fatalf("expired lease: %d %s, want 410", a.status, a.body)
	}
}

// TestLeaseInBatch: a batch item admitted on a tier with a concurrency limit carries its lease.
func TestLeaseInBatch(t *testing.T) {
	h := NewDecisions(leaseEngine(t, testsupport.NewClock(), 100, 1, "api"), nil)
	a := serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[{"key":"k"},{"key":"k"}]}`)
	var v struct {
		Results []leaseAnswer `json:"results"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil || len(v.Results) != 2 {
		t.Fatalf("batch: %d %s", a.status, a.body)
	}
	if v.Results[0].Lease == "" || v.Results[1].Lease != "" {
		t.Fatalf("batch: %s; want a lease for the admitted item only", a.body)
	}
	if a := serve(t, h, http.MethodPost, "/v1/release", releaseOf(v.Results[0].Lease, false)); a.status != http.StatusOK {
		t.Fatalf("release of a batch item's lease: %d %s", a.status, a.body)
	}
}

func TestDecodeReleaseRequest(t *testing.T) {
	for body, want := range map[string]ReleaseRequest{
		`{"lease":"abc"}`:                     {Lease: "abc"},
		` {"extend":true, "lease":"a\u0062"}`: {Lease: "ab", Extend: true},
		`{"lease":"abc","extend":false}`:      {Lease: "abc"},
		`{"lease":"abc","extend":null}`:       {Lease: "abc"},
	} {
		if got, err := DecodeReleaseRequest([]byte(body)); err != nil || got != want {
			t.Errorf("%s: %+v %v, want %+v", body, got, err, want)
		}
	}
	for body, want := range map[string]string{
		`{}`:                            "lease is required",
		`{"lease":""}`:                  "lease is required",
		`{"lease":1}`:                   "lease must be a string",
		`{"lease":"a","extend":1}`:      "extend must be true or false",
		`{"lease":"a","extend":"true"}`: "extend must be true or false",
		`{"lease":"a","ttl":5}`:         "the policy sets the lease timeout",
		`{"lease":"a","timeout":"1h"}`:  "the policy sets the lease timeout",
		`{"lease":"a","lease":"b"}`:     "twice",
		`{"lease":"` + strings.Repeat("A", reservation.MaxTokenBytes+1) + `"}`: "longer than",
		`{"lease":"a"} x`: "after the JSON object",
	} {
		if _, err := DecodeReleaseRequest([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

// FuzzDecodeReleaseRequest checks the decoder against encoding/json: whatever it accepts is
// valid JSON that encoding/json decodes to the same request, and it re-encodes to itself.
func FuzzDecodeReleaseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"lease":"AwAAAAAAAAAA","extend":true}`, `{"lease":"abc-_"}`, `{"extend":null,"lease":"\u0041"}`,
		`{"lease":"x","extend":1}`, `{"lease":"x","extend":0}`, `{"lease":"x","ttl":5}`, `{"lease":""}`, `{"lease":"x","extend":false }`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := DecodeReleaseRequest(body)
		if err != nil {
			var reqErr errRequest
			if !errors.As(err, &reqErr) {
				t.Fatalf("error %v is not a client error", err)
			}
			return
		}
		if got.Lease == "" || len(got.Lease) > reservation.MaxTokenBytes || !utf8.ValidString(got.Lease) {
			t.Fatalf("accepted %+v", got)
		}
		var std struct {
			Lease  *string `json:"lease"`
			Extend *bool   `json:"extend"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&std); err != nil || dec.More() {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		if std.Lease == nil || *std.Lease != got.Lease || (std.Extend != nil && *std.Extend != got.Extend) || (std.Extend == nil && got.Extend) {
			t.Fatalf("%+v, encoding/json says %+v", got, std)
		}
		again, err := json.Marshal(map[string]any{"lease": got.Lease, "extend": got.Extend})
		if err != nil {
			t.Fatal(err)
		}
		if round, err := DecodeReleaseRequest(again); err != nil || round != got {
			t.Fatalf("%s decodes to %+v %v, want %+v", again, round, err, got)
		}
	})
}
