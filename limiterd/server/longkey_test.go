package server

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
)

// allowBody returns the body of a decision request for key.
func allowBody(t testing.TB, key string, cost int64) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"policy": "default/api", "key": key, "cost": cost})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A key's length never decides whether a request is limited: keys longer than MaxKeyBytes are
// clients like any other, each its own, with the tier the overrides give them.
func TestLongKeysAreLimitedLikeAnyKey(t *testing.T) {
	clock := testsupport.NewClock()
	p := newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Minute), testsupport.TokenBucketTier("vip", 5, 1, time.Minute))
	p.Spec.Overrides = []v1alpha1.Override{overrideOf("vip", nil, []string{"vip:"})}
	h := NewDecisions(newEngine(t, clock, p), nil)

	shared := strings.Repeat("s", MaxKeyBytes+50) // two keys with the same first 1,074 bytes
	keys := map[string]string{
		"1,025 bytes":         strings.Repeat("a", MaxKeyBytes+1),
		"60 KiB":              strings.Repeat("b", 60<<10),
		"shared prefix, one":  shared + "1",
		"shared prefix, two":  shared + "2",
		"1,024 bytes (as is)": strings.Repeat("c", MaxKeyBytes),
	}
	for name, key := range keys {
		for i, want := range []int{200, 200, 200, 429} {
			a := serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, key, 1))
			if a.status != want {
				t.Fatalf("%s: request %d: %d %s, want %d", name, i, a.status, a.body, want)
			}
			if got := a.header.Get("RateLimit-Policy"); got != `"standard";q=3;w=180` {
				t.Fatalf("%s: RateLimit-Policy %q, want the default tier's", name, got)
			}
		}
	}
	// Over GET too, on the same client as POST.
	long := keys["1,025 bytes"]
	if a := serve(t, h, http.MethodGet, "/v1/allow?policy=default/api&key="+long, ""); a.status != 429 {
		t.Errorf("GET with the spent 1,025-byte key: %d %s, want 429", a.status, a.body)
	}
	if a := serve(t, h, http.MethodGet, "/v1/allow?policy=default/api&key="+strings.Repeat("d", MaxKeyBytes+1), ""); a.status != 200 || !strings.Contains(a.body, `"remaining":2`) {
		t.Errorf("GET with a fresh long key: %d %s, want 200 with 2 left", a.status, a.body)
	}
	// A prefix override names a long key by its first bytes.
	vip := "vip:" + strings.Repeat("v", 2*MaxKeyBytes)
	for i, want := range []int{200, 200, 200, 200, 200, 429} {
		a := serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, vip, 1))
		if a.status != want || a.header.Get("RateLimit-Policy") != `"vip";q=5;w=300` {
			t.Fatalf("long vip key: request %d: %d %q %s, want %d by the vip tier", i, a.status, a.header.Get("RateLimit-Policy"), a.body, want)
		}
	}
}

// The digest form is no way into another client's state: a key that looks like a digest is
// digested itself.
func TestDigestFormKeysReachNoOtherClient(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Minute))), nil)
	long := strings.Repeat("x", MaxKeyBytes+1)
	for range 2 {
		serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, long, 1))
	}
	if a := serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, long, 1)); a.status != 429 {
		t.Fatalf("long key after 2: %d %s, want 429", a.status, a.body)
	}
	sum := sha256.Sum256([]byte(long))
	for _, key := range []string{"sha256:" + hex.EncodeToString(sum[:]), "sha256:" + strings.ToUpper(hex.EncodeToString(sum[:])), hex.EncodeToString(sum[:])} {
		if a := serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, key, 1)); a.status != 200 || !strings.Contains(a.body, `"remaining":1`) {
			t.Errorf("key %q: %d %s, want a fresh client's 200 with 1 left", key, a.status, a.body)
		}
	}
	// And a short key in the digest form is a client of its own, decided like any.
	for i, want := range []int{200, 200, 429} {
		if a := serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, "sha256:abc", 1)); a.status != want {
			t.Errorf("sha256:abc request %d: %d %s, want %d", i, a.status, a.body, want)
		}
	}
}

// Every path names a long key's client the same way: decisions, batches, peeks, refunds and
// the admin API.
func TestLongKeysOnEveryPath(t *testing.T) {
	clock := testsupport.NewClock()
	p := newPolicy("api", testsupport.TokenBucketTier("standard", 4, 1, time.Minute))
	p.Spec.Refunds = v1alpha1.RefundsEnabled
	e := newEngine(t, clock, p)
	h := NewDecisions(e, nil)
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	key := strings.Repeat("é", MaxKeyBytes) // 2,048 bytes
	remaining := func(what string, want int64) {
		t.Helper()
		a := serve(t, admin, http.MethodGet, "/v1/clients?policy=default/api&key="+url.QueryEscape(key), "")
		var c ClientAnswer
		if err := json.Unmarshal([]byte(a.body), &c); a.status != 200 || err != nil || c.Remaining == nil || *c.Remaining != want {
			t.Fatalf("after %s: admin peek %d %s, want %d remaining", what, a.status, a.body, want)
		}
	}
	var charged struct{ Reservation string }
	if a := serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, key, 2)); a.status != 200 || json.Unmarshal([]byte(a.body), &charged) != nil || charged.Reservation == "" {
		t.Fatalf("decision of 2: %d %s, want 200 with a reservation", a.status, a.body)
	}
	remaining("a decision of 2", 2)
	batch := `{"items":[` + allowBody(t, key, 1) + `,` + allowBody(t, key, 0) + `]}`
	if a := serve(t, h, http.MethodPost, "/v1/allow:batch", batch); a.status != 200 || !strings.Contains(a.body, `"remaining":1`) {
		t.Fatalf("batch: %d %s", a.status, a.body)
	}
	remaining("a batch of 1 and a peek", 1)
	// The reservation names the stored (digest) key, and refunds the tier it charged.
	refund, _ := json.Marshal(map[string]any{"reservation": charged.Reservation})
	if a := serve(t, h, http.MethodPost, "/v1/refund", string(refund)); a.status != 200 || !strings.Contains(a.body, `"remaining":3`) {
		t.Fatalf("refund: %d %s", a.status, a.body)
	}
	remaining("a refund of 2", 3)
	if a := serve(t, admin, http.MethodDelete, "/v1/clients?policy=default/api&key="+url.QueryEscape(key), ""); a.status != 204 {
		t.Fatalf("reset: %d %s", a.status, a.body)
	}
	remaining("a reset", 4)
}

// tierNames Hidden names every tier "limit" in the answers, so that a client cannot tell which
// tier a key it tries lands in; the admin API keeps the real name.
func TestHiddenTierNames(t *testing.T) {
	clock := testsupport.NewClock()
	p := newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Minute), testsupport.TokenBucketTier("partners", 5, 1, time.Minute),
		v1alpha1.Tier{Name: "metered", Limits: []v1alpha1.Limit{
			{Name: "burst", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: &v1alpha1.TokenBucket{Capacity: 2, RefillRate: 1}},
			{Name: "daily", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: &v1alpha1.TokenBucket{Capacity: 9, RefillRate: 1, RefillPeriod: &metav1.Duration{Duration: time.Hour}}},
		}})
	p.Spec.Overrides = []v1alpha1.Override{overrideOf("partners", []string{"sub:acme"}, nil), overrideOf("metered", []string{"sub:hooli"}, nil)}
	p.Spec.TierNames = v1alpha1.TierNamesHidden
	e := newEngine(t, clock, p)
	h := NewDecisions(e, nil)
	for key, want := range map[string][2]string{
		"sub:eve":   {`"limit";q=3;w=180`, `"limit";r=2;t=60`},
		"sub:acme":  {`"limit";q=5;w=300`, `"limit";r=4;t=60`},
		"sub:hooli": {`"limit/burst";q=2;w=2, "limit/daily";q=9;w=32400`, `"limit/burst";r=1;t=1`},
	} {
		a := serve(t, h, http.MethodPost, "/v1/allow", allowBody(t, key, 1))
		if a.status != 200 || a.header.Get("RateLimit-Policy") != want[0] || a.header.Get("RateLimit") != want[1] {
			t.Errorf("%s: %d RateLimit-Policy %q RateLimit %q, want %q %q", key, a.status, a.header.Get("RateLimit-Policy"), a.header.Get("RateLimit"), want[0], want[1])
		}
		for _, name := range []string{"standard", "partners", "metered"} {
			if strings.Contains(a.body, name) || strings.Contains(a.header.Get("RateLimit-Policy")+a.header.Get("RateLimit"), name) {
				t.Errorf("%s: the answer names the tier %q: %v %s", key, name, a.header, a.body)
			}
		}
	}
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	if a := serve(t, admin, http.MethodGet, "/v1/clients?policy=default/api&key=sub:acme", ""); !strings.Contains(a.body, `"tier":"partners"`) {
		t.Errorf("admin API: %d %s, want the real tier name", a.status, a.body)
	}
	// The names are built once, at compile time: an answer costs what it did.
	res, err := e.Decide(t.Context(), "default/api", "sub:hooli", 0)
	if err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = res.Tier.AppendRateLimitPolicy(make([]byte, 0, 128)) }); allocs > 1 {
		t.Errorf("AppendRateLimitPolicy allocates %v times", allocs)
	}
}
