// Package reservation issues and verifies reservations: opaque, unforgeable tokens that name
// what an admitted request charged, so that a later call can give it back (a refund; later, the
// release of a concurrency lease) without the caller being able to name anything else.
//
// A reservation is a Claim — the policy, the client key as stored, a Tag standing for the tier
// that charged, the units charged, the instant of the decision and the instant after which the
// reservation is void — with an ID unique to it, signed with HMAC-SHA256 under a key every
// replica shares. Its text is base64url (no padding) of
//
//	version (1 byte, 2) | at (8, Unix ns) | until (8, Unix ns) | cost (8) | id (16) |
//	tier tag (16) | len(policy) (2) | policy | len(key) (2) | key | HMAC-SHA256 (32)
//
// integers big-endian. The token is signed, not encrypted: whoever holds it can read the
// policy, key and cost it names (all of which the caller of the decision knew), but not the
// tier: a Tag is a keyed digest, which only holders of the key can relate to what it stands
// for (a policy may hide its tier names from callers). Parse refuses a token that is
// malformed, of another version (version 1 named the tier in clear), whose signature fails
// (forged, altered, or signed under another key), or whose until has passed.
//
// What a reservation is good for, and how often, is its user's business: this package only
// proves that a Signer with the same key issued a claim. Spending a reservation once needs a
// record of its ID that lives until its until (see limiter.Once).
package reservation

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"
	"sync/atomic"
	"time"
)

// Sizes.
const (
	// MinKeyBytes is the shortest signing key NewSigner accepts: 256 bits.
	MinKeyBytes = 32
	// IDBytes is the size of a reservation's ID.
	IDBytes = 16
	// TagBytes is the size of a Tag.
	TagBytes = 16
	// MaxPolicyBytes and MaxKeyBytes bound what a claim names.
	MaxPolicyBytes = 1<<16 - 1
	MaxKeyBytes    = 1<<16 - 1
	// MaxTokenBytes bounds the text of a token Parse reads: a claim with a 1,024-byte key and a
	// policy ID of its longest fits with room to spare.
	MaxTokenBytes = 4096

	version    = 2
	macBytes   = sha256.Size
	headerSize = 1 + 8 + 8 + 8 + IDBytes + TagBytes
	minRaw     = headerSize + 2 + 2 + macBytes
)

// Errors of Parse.
var (
	// ErrMalformed: the text is no reservation of this version.
	ErrMalformed = errors.New("malformed reservation")
	// ErrForged: the signature does not match: altered, forged, or signed under another key.
	ErrForged = errors.New("reservation signature does not match")
	// ErrExpired: the reservation's until has passed.
	ErrExpired = errors.New("reservation expired")
)

// Claim is what a reservation names.
type Claim struct {
	// Policy is the policy's ID ("<namespace>/<name>").
	Policy string
	// Key is the client key as the store keeps it.
	Key string
	// Tier stands for the tier that charged (Signer.Tag): the caller holding the token cannot
	// tell which tier it is.
	Tier Tag
	// Cost is the units charged, at least 1.
	Cost int64
	// At is the instant of the decision; Until the first instant at which the reservation is
	// void (after At).
	At, Until time.Time
}

// ID identifies one reservation: unique among the reservations of every Signer (8 random
// bytes a Signer, then a counter), not secret.
type ID [IDBytes]byte

// Tag stands for a name inside a claim without showing it: the first TagBytes bytes of
// HMAC-SHA256, under the Signer's key, of the name with a prefix of its own (so that no tag is
// the MAC of any other message). Equal names give equal tags under one key; without the key a
// tag tells nothing of its name, even a short, guessable one.
type Tag [TagBytes]byte

// Reservation is a verified claim and its ID.
type Reservation struct {
	Claim
	ID ID
}

// Signer issues and verifies reservations under one key. It is safe for concurrent use.
type Signer struct {
	key    []byte
	macs   sync.Pool // of hash.Hash: HMAC-SHA256 under key
	prefix [8]byte   // random, this Signer's
	next   atomic.Uint64
}

// NewSigner returns a Signer under key (at least MinKeyBytes bytes; it is copied).
func NewSigner(key []byte) (*Signer, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("reservation key has %d bytes, want at least %d", len(key), MinKeyBytes)
	}
	s := &Signer{key: append([]byte(nil), key...)}
	s.macs.New = func() any { return hmac.New(sha256.New, s.key) }
	if _, err := rand.Read(s.prefix[:]); err != nil {
		return nil, fmt.Errorf("reservation ID prefix: %w", err)
	}
	return s, nil
}

// RandomSigner returns a Signer under a key of its own, random: good for state that lives in one
// process only (its reservations verify nowhere else).
func RandomSigner() *Signer {
	key := make([]byte, MinKeyBytes)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	s, err := NewSigner(key)
	if err != nil {
		panic(err) // unreachable: the key is long enough and crypto/rand does not fail
	}
	return s
}

// Tag returns the tag of name under s's key.
func (s *Signer) Tag(name string) Tag {
	const prefix = "limiterd reservation tag\x00"
	msg := make([]byte, 0, len(prefix)+len(name))
	msg = append(append(msg, prefix...), name...)
	var buf [macBytes]byte
	var t Tag
	copy(t[:], s.sum(buf[:0], msg))
	return t
}

// Issue returns the token of c under a new ID. Fields longer than MaxPolicyBytes or MaxKeyBytes
// are an error, as is a cost below 1 or an until not after at.
func (s *Signer) Issue(c *Claim) (string, error) {
	switch {
	case len(c.Policy) > MaxPolicyBytes || len(c.Key) > MaxKeyBytes:
		return "", fmt.Errorf("issue reservation: a name is too long (policy %d, key %d bytes)", len(c.Policy), len(c.Key))
	case c.Cost < 1:
		return "", fmt.Errorf("issue reservation: cost %d", c.Cost)
	case !c.Until.After(c.At):
		return "", fmt.Errorf("issue reservation: until %v is not after %v", c.Until, c.At)
	}
	var id ID
	copy(id[:8], s.prefix[:])
	binary.BigEndian.PutUint64(id[8:], s.next.Add(1))
	n := headerSize + 2 + len(c.Policy) + 2 + len(c.Key) + macBytes
	var small [256]byte
	raw := small[:0]
	if n > len(small) {
		raw = make([]byte, 0, n)
	}
	raw = append(raw, version)
	raw = binary.BigEndian.AppendUint64(raw, uint64(c.At.UnixNano()))
	raw = binary.BigEndian.AppendUint64(raw, uint64(c.Until.UnixNano()))
	raw = binary.BigEndian.AppendUint64(raw, uint64(c.Cost))
	raw = append(raw, id[:]...)
	raw = append(raw, c.Tier[:]...)
	raw = binary.BigEndian.AppendUint16(raw, uint16(len(c.Policy)))
	raw = append(raw, c.Policy...)
	raw = binary.BigEndian.AppendUint16(raw, uint16(len(c.Key)))
	raw = append(raw, c.Key...)
	raw = s.sum(raw, raw)
	return base64.RawURLEncoding.EncodeToString(raw), nil
}

// sum appends the HMAC of msg to dst.
func (s *Signer) sum(dst, msg []byte) []byte {
	h := s.macs.Get().(hash.Hash)
	h.Reset()
	h.Write(msg)
	dst = h.Sum(dst)
	s.macs.Put(h)
	return dst
}

// Parse verifies token and returns its reservation. It fails with ErrMalformed, ErrForged or
// ErrExpired (until at or before now), wrapped; the signature is checked before anything the
// token says is believed.
func (s *Signer) Parse(token string, now time.Time) (Reservation, error) {
	if len(token) > MaxTokenBytes {
		return Reservation{}, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, MaxTokenBytes)
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return Reservation{}, fmt.Errorf("%w: not base64url", ErrMalformed)
	}
	if len(raw) < minRaw {
		return Reservation{}, fmt.Errorf("%w: too short", ErrMalformed)
	}
	msg, mac := raw[:len(raw)-macBytes], raw[len(raw)-macBytes:]
	var buf [macBytes]byte
	if !hmac.Equal(s.sum(buf[:0], msg), mac) {
		return Reservation{}, ErrForged
	}
	if msg[0] != version {
		return Reservation{}, fmt.Errorf("%w: version %d", ErrMalformed, msg[0])
	}
	var r Reservation
	r.At = time.Unix(0, int64(binary.BigEndian.Uint64(msg[1:])))
	r.Until = time.Unix(0, int64(binary.BigEndian.Uint64(msg[9:])))
	r.Cost = int64(binary.BigEndian.Uint64(msg[17:]))
	copy(r.ID[:], msg[25:25+IDBytes])
	copy(r.Tier[:], msg[25+IDBytes:headerSize])
	rest := msg[headerSize:]
	var ok bool
	if r.Policy, rest, ok = field(rest); ok {
		r.Key, rest, ok = field(rest)
	}
	if !ok || len(rest) != 0 || r.Cost < 1 || !r.Until.After(r.At) {
		return Reservation{}, fmt.Errorf("%w: bad fields", ErrMalformed)
	}
	if !now.Before(r.Until) {
		return Reservation{}, fmt.Errorf("%w at %s", ErrExpired, r.Until.UTC().Format(time.RFC3339Nano))
	}
	return r, nil
}

// field reads a string prefixed by its length in 2 bytes.
func field(b []byte) (string, []byte, bool) {
	if len(b) < 2 {
		return "", nil, false
	}
	n := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if len(b) < n {
		return "", nil, false
	}
	return string(b[:n]), b[n:], true
}
