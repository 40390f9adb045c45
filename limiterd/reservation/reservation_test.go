package reservation

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)

func signer(t testing.TB, fill byte) *Signer {
	t.Helper()
	s, err := NewSigner(bytes.Repeat([]byte{fill}, MinKeyBytes))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claim() Claim {
	return Claim{Policy: "team/api", Key: "alice", Tier: Tag{0xf, 0xe, 0xe}, Cost: 3, At: t0, Until: t0.Add(time.Second)}
}

func TestRoundTrip(t *testing.T) {
	s := signer(t, 1)
	for _, c := range []Claim{claim(), {Policy: strings.Repeat("p", 317), Key: strings.Repeat("k\x00{", 400),
		Tier: Tag{15: 1}, Cost: 1e9, At: t0, Until: t0.Add(366 * 24 * time.Hour)}} {
		tok, err := s.Issue(&c)
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Parse(tok, t0)
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if r.Policy != c.Policy || r.Key != c.Key || r.Tier != c.Tier || r.Cost != c.Cost || !r.At.Equal(c.At) || !r.Until.Equal(c.Until) {
			t.Errorf("Parse = %+v, want %+v", r.Claim, c)
		}
		if len(tok) > MaxTokenBytes {
			t.Errorf("token of %d bytes, over MaxTokenBytes", len(tok))
		}
	}
}

func TestIDsAreUnique(t *testing.T) {
	a, b := signer(t, 1), signer(t, 1)
	seen := map[ID]bool{}
	c := claim()
	for _, s := range []*Signer{a, b, a, b} {
		tok, _ := s.Issue(&c)
		r, err := a.Parse(tok, t0)
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.ID] {
			t.Fatalf("ID %x issued twice", r.ID)
		}
		seen[r.ID] = true
	}
}

func TestParseRefuses(t *testing.T) {
	s := signer(t, 1)
	c := claim()
	tok, _ := s.Issue(&c)
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	flip := func(i int) string {
		b := bytes.Clone(raw)
		b[i] ^= 1
		return base64.RawURLEncoding.EncodeToString(b)
	}
	// A token whose claim is rewritten (cost 3 -> 1000) and signed under another key.
	other := signer(t, 2)
	c2 := claim()
	c2.Cost = 1000
	otherTok, _ := other.Issue(&c2)
	for name, tt := range map[string]struct {
		token string
		now   time.Time
		want  error
	}{
		"empty":             {"", t0, ErrMalformed},
		"not base64":        {"%%%", t0, ErrMalformed},
		"padding":           {tok + "=", t0, ErrMalformed},
		"too long":          {strings.Repeat("A", MaxTokenBytes+1), t0, ErrMalformed},
		"truncated":         {tok[:len(tok)-4], t0, ErrForged},
		"cost altered":      {flip(24), t0, ErrForged},
		"key altered":       {flip(len(raw) - macBytes - 1), t0, ErrForged},
		"signature altered": {flip(len(raw) - 1), t0, ErrForged},
		"another key":       {otherTok, t0, ErrForged},
		"expired":           {tok, t0.Add(time.Second), ErrExpired},
		"long expired":      {tok, t0.Add(time.Hour), ErrExpired},
	} {
		if _, err := s.Parse(tt.token, tt.now); !errors.Is(err, tt.want) {
			t.Errorf("%s: Parse = %v, want %v", name, err, tt.want)
		}
	}
	if _, err := s.Parse(tok, t0.Add(time.Second-1)); err != nil {
		t.Errorf("Parse just before until: %v", err)
	}
}

// TestTierIsNotReadable: a token shows nothing of the tier's name (a policy may hide it), and a
// tag is the name's under one key only. Before tags, version 1 tokens carried the name in clear.
func TestTierIsNotReadable(t *testing.T) {
	s, other := signer(t, 1), signer(t, 2)
	c := claim()
	c.Tier = s.Tag("team/api\x00enterprise-partners")
	tok, err := s.Issue(&c)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	if bytes.Contains(raw, []byte("enterprise")) {
		t.Errorf("the token carries the tier name: %q", raw)
	}
	gold, goldAgain := s.Tag("gold"), s.Tag("gold")
	switch {
	case gold != goldAgain:
		t.Error("one name gives two tags")
	case s.Tag("gold") == s.Tag("silver"):
		t.Error("two names give one tag")
	case s.Tag("gold") == other.Tag("gold"):
		t.Error("the tag does not depend on the key")
	}
	// A well-signed token of version 1 is refused as malformed.
	raw = bytes.Clone(raw[:len(raw)-macBytes])
	raw[0] = 1
	old := base64.RawURLEncoding.EncodeToString(s.sum(raw, raw))
	if _, err := s.Parse(old, t0); !errors.Is(err, ErrMalformed) {
		t.Errorf("Parse of a version 1 token = %v, want ErrMalformed", err)
	}
}

func TestIssueRefuses(t *testing.T) {
	s := signer(t, 1)
	for name, mut := range map[string]func(*Claim){
		"cost 0":       func(c *Claim) { c.Cost = 0 },
		"until at":     func(c *Claim) { c.Until = c.At },
		"key too long": func(c *Claim) { c.Key = strings.Repeat("k", MaxKeyBytes+1) },
	} {
		c := claim()
		mut(&c)
		if _, err := s.Issue(&c); err == nil {
			t.Errorf("%s: Issue succeeded", name)
		}
	}
	if _, err := NewSigner(make([]byte, MinKeyBytes-1)); err == nil {
		t.Error("NewSigner accepted a short key")
	}
}

// FuzzParse: Parse never panics, accepts only what the signer issued, and what it accepts
// round-trips.
func FuzzParse(f *testing.F) {
	s := signer(f, 1)
	c := claim()
	tok, _ := s.Issue(&c)
	f.Add(tok)
	f.Add("")
	f.Add(tok[:10])
	f.Add(strings.Repeat("A", 200))
	f.Fuzz(func(t *testing.T, token string) {
		r, err := s.Parse(token, t0)
		if err != nil {
			return
		}
		again, err := s.Issue(&r.Claim)
		if err != nil {
			t.Fatalf("a parsed claim does not issue: %v", err)
		}
		if r2, err := s.Parse(again, t0); err != nil || r2.Claim != r.Claim {
			t.Fatalf("round trip: %+v, %v; want %+v", r2.Claim, err, r.Claim)
		}
	})
}

func BenchmarkIssue(b *testing.B) {
	s := signer(b, 1)
	c := claim()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Issue(&c); err != nil {
			b.Fatal(err)
		}
	}
}
