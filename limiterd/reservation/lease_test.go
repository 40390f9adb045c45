package reservation

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLeaseRoundTrip(t *testing.T) {
	s := signer(t, 1)
	c := claim()
	for _, seq := range []uint64{1, 2, 1 << 63, ^uint64(0)} {
		tok, err := s.IssueLease(&c, seq)
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.ParseLease(tok, t0)
		if err != nil {
			t.Fatalf("ParseLease: %v", err)
		}
		if l.Policy != c.Policy || l.Key != c.Key || l.Tier != c.Tier || l.Cost != c.Cost || !l.At.Equal(c.At) || !l.Until.Equal(c.Until) || l.Seq != seq {
			t.Errorf("ParseLease = %+v seq %d, want %+v seq %d", l.Claim, l.Seq, c, seq)
		}
	}
	if _, err := s.IssueLease(&c, 0); err == nil {
		t.Error("IssueLease signed seq 0")
	}
}

// TestLeaseIsNoReservation: the kind is signed; a reservation is no lease, a lease no
// reservation, even under one key and with the same fields.
func TestLeaseIsNoReservation(t *testing.T) {
	s := signer(t, 1)
	c := claim()
	lease, _ := s.IssueLease(&c, 7)
	rsv, _ := s.Issue(&c)
	if _, err := s.Parse(lease, t0); !errors.Is(err, ErrMalformed) {
		t.Errorf("Parse of a lease = %v, want ErrMalformed", err)
	}
	if _, err := s.ParseLease(rsv, t0); !errors.Is(err, ErrMalformed) {
		t.Errorf("ParseLease of a reservation = %v, want ErrMalformed", err)
	}
	// The version byte rewritten to a reservation's fails the signature.
	raw, _ := base64.RawURLEncoding.DecodeString(lease)
	raw[0] = version
	if _, err := s.Parse(base64.RawURLEncoding.EncodeToString(raw), t0); !errors.Is(err, ErrForged) {
		t.Errorf("Parse of a lease relabelled = %v, want ErrForged", err)
	}
}

// TestParseLeaseRefuses flips bits of the decoded token, never of its text (a flip of the last
// base64 character may change only padding bits, which decode to the same bytes).
func TestParseLeaseRefuses(t *testing.T) {
	s := signer(t, 1)
	c := claim()
	tok, _ := s.IssueLease(&c, 42)
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	flip := func(i int) string {
		b := bytes.Clone(raw)
		b[i] ^= 1
		return base64.RawURLEncoding.EncodeToString(b)
	}
	other := signer(t, 2)
	otherTok, _ := other.IssueLease(&c, 42)
	for name, tt := range map[string]struct {
		token string
		now   time.Time
		want  error
	}{
		"empty":             {"", t0, ErrMalformed},
		"not base64":        {"%%%", t0, ErrMalformed},
		"too long":          {strings.Repeat("A", MaxTokenBytes+1), t0, ErrMalformed},
		"truncated":         {tok[:len(tok)-4], t0, ErrForged},
		"expiry altered":    {flip(16), t0, ErrForged},
		"places altered":    {flip(24), t0, ErrForged},
		"seq altered":       {flip(32), t0, ErrForged},
		"tag altered":       {flip(33), t0, ErrForged},
		"key altered":       {flip(len(raw) - macBytes - 1), t0, ErrForged},
		"signature altered": {flip(len(raw) - 1), t0, ErrForged},
		"another key":       {otherTok, t0, ErrForged},
		"expired":           {tok, t0.Add(time.Second), ErrExpired},
	} {
		if _, err := s.ParseLease(tt.token, tt.now); !errors.Is(err, tt.want) {
			t.Errorf("%s: ParseLease = %v, want %v", name, err, tt.want)
		}
	}
	// A well-signed seq 0 names no lease.
	b := bytes.Clone(raw[:len(raw)-macBytes])
	clear(b[25:33])
	if _, err := s.ParseLease(base64.RawURLEncoding.EncodeToString(s.sum(b, b)), t0); !errors.Is(err, ErrMalformed) {
		t.Errorf("ParseLease of seq 0 = %v, want ErrMalformed", err)
	}
}

// FuzzParseLease: ParseLease never panics, accepts only what the signer issued, and what it
// accepts round-trips.
func FuzzParseLease(f *testing.F) {
	s := signer(f, 1)
	c := claim()
	tok, _ := s.IssueLease(&c, 9)
	rsv, _ := s.Issue(&c)
	f.Add(tok)
	f.Add(rsv)
	f.Add("")
	f.Add(tok[:10])
	f.Fuzz(func(t *testing.T, token string) {
		l, err := s.ParseLease(token, t0)
		if err != nil {
			return
		}
		again, err := s.IssueLease(&l.Claim, l.Seq)
		if err != nil {
			t.Fatalf("a parsed lease does not issue: %v", err)
		}
		if again != tok { // a lease's token is a function of its claim and seq
			t.Fatalf("accepted %q, a lease the signer did not issue", token)
		}
		if l2, err := s.ParseLease(again, t0); err != nil || l2 != l {
			t.Fatalf("round trip: %+v, %v; want %+v", l2, err, l)
		}
	})
}
