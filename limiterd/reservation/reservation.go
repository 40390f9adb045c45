// Package reservation issues and verifies reservations and leases: opaque, unforgeable tokens
// that name what an admitted request charged, so that a later call can give it back (a refund)
// or end it (the release of a concurrency lease) without the caller being able to name anything
// else.
//
// A reservation is a Claim — the policy, the client key as stored, a Tag standing for the tier
// that charged, the units charged, the instant of the decision and the instant after which the
// reservation is void — with an ID unique to it, signed with HMAC-SHA256 under a key every
// replica shares. Its text is base64url (no padding) of
//
//	version (1 byte, 2) | at (8, Unix ns) | until (8, Unix ns) | cost (8) | id (16) |
//	tier tag (16) | len(policy) (2) | policy | len(key) (2) | key | HMAC-SHA256 (32)
//
// integers big-endian. A lease (IssueLease) is the same Claim — the places taken as its cost,
// its expiry as its until — named by the lease's seq (limiter.Decision.Lease) instead of an ID:
//
//	version (1 byte, 3) | at (8) | until (8) | places (8) | seq (8) | tier tag (16) |
//	len(policy) (2) | policy | len(key) (2) | key | HMAC-SHA256 (32)
//
// The version byte is signed with the rest, so a reservation never parses as a lease nor a
// lease as a reservation. A seq alone is sequential, guessable, and restarts with the process:
// only the signature binds it to its policy, client, tier and instant.
//
// The token is signed, not encrypted: whoever holds it can read the
// policy, key and cost it names (all of which the caller of the decision knew), but not the
// tier: a Tag is a keyed digest, which only holders of the key can relate to what it stands
// for (a policy may hide its tier names from callers). Parse and ParseLease refuse a token that
// is malformed, of another version or kind (version 1 named the tier in clear), whose signature
// fails (forged, altered, or signed under another key), or whose until has passed.
//
// What a reservation is good for, and how often, is its user's business: this package only
// proves that a Signer with the same key issued a claim. Spending a reservation once needs a
// record of its ID that lives until its until (see limiter.Once); a lease's record is its entry
// in its client's state (limiter.Concurrency).
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

	version      = 2 // a refund's reservation
	leaseVersion = 3 // a lease
	seqBytes     = 8 // a lease's seq, in place of an ID
	macBytes     = sha256.Size
	// minRaw is the fewest bytes of any token (a lease with empty names): fewer are malformed
	// before the signature is checked.
	minRaw = 1 + 8 + 8 + 8 + seqBytes + TagBytes + 2 + 2 + macBytes
)

// Errors of Parse and ParseLease.
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
	var id ID
	copy(id[:8], s.prefix[:])
	binary.BigEndian.PutUint64(id[8:], s.next.Add(1))
	return s.issue(version, c, id[:])
}

// Lease is a verified lease: its claim (Cost: the places it holds; At: the instant it was
// issued, its admission's or its last extension's; Until: its expiry) and its seq.
type Lease struct {
	Claim
	// Seq names the lease among the leases of its store (limiter.Decision.Lease), never 0.
	Seq uint64
}

// IssueLease returns the token of the lease named seq (not 0) whose claim is c: its places as
// c.Cost, its expiry as c.Until. It fails as Issue does, and for a seq of 0.
func (s *Signer) IssueLease(c *Claim, seq uint64) (string, error) {
	if seq == 0 {
		return "", errors.New("issue lease: seq 0 names no lease")
	}
	var b [seqBytes]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return s.issue(leaseVersion, c, b[:])
}

// issue returns the token of version v naming c, with name (a reservation's ID, a lease's seq)
// after its cost.
func (s *Signer) issue(v byte, c *Claim, name []byte) (string, error) {
	switch {
	case len(c.Policy) > MaxPolicyBytes || len(c.Key) > MaxKeyBytes:
		return "", fmt.Errorf("issue reservation: a name is too long (policy %d, key %d bytes)", len(c.Policy), len(c.Key))
	case c.Cost < 1:
		return "", fmt.Errorf("issue reservation: cost %d", c.Cost)
	case !c.Until.After(c.At):
		return "", fmt.Errorf("issue reservation: until %v is not after %v", c.Until, c.At)
	}
	n := 1 + 8 + 8 + 8 + len(name) + TagBytes + 2 + len(c.Policy) + 2 + len(c.Key) + macBytes
	var small [256]byte
	raw := small[:0]
	if n > len(small) {
		raw = make([]byte, 0, n)
	}
	raw = append(raw, v)
	raw = binary.BigEndian.AppendUint64(raw, uint64(c.At.UnixNano()))
	raw = binary.BigEndian.AppendUint64(raw, uint64(c.Until.UnixNano()))
	raw = binary.BigEndian.AppendUint64(raw, uint64(c.Cost))
	raw = append(raw, name...)
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

// Parse verifies token and returns its reservation. It fails with ErrMalformed (a lease's token
// too), ErrForged or ErrExpired (until at or before now), wrapped; the signature is checked
// before anything the token says is believed.
func (s *Signer) Parse(token string, now time.Time) (Reservation, error) {
	var r Reservation
	name, err := s.parse(token, now, version, &r.Claim)
	if err != nil {
		return Reservation{}, err
	}
	copy(r.ID[:], name)
	return r, nil
}

// ParseLease verifies token and returns its lease, as Parse does for a reservation: it fails
// with ErrMalformed (a reservation's token too), ErrForged or ErrExpired (the lease's expiry at
// or before now), wrapped. With ErrExpired it returns the lease's claim, verified, and no seq:
// who the lease was for, to count its late release on its policy and tier.
func (s *Signer) ParseLease(token string, now time.Time) (Lease, error) {
	var l Lease
	name, err := s.parse(token, now, leaseVersion, &l.Claim)
	if errors.Is(err, ErrExpired) {
		return Lease{Claim: l.Claim}, err
	}
	if err != nil {
		return Lease{}, err
	}
	if l.Seq = binary.BigEndian.Uint64(name); l.Seq == 0 {
		return Lease{}, fmt.Errorf("%w: seq 0", ErrMalformed) // IssueLease never signs one
	}
	return l, nil
}

// parse verifies token, a token of version v, into c and returns the name it holds after its
// cost (a reservation's ID, a lease's seq): a view of the token's bytes.
func (s *Signer) parse(token string, now time.Time, v byte, c *Claim) ([]byte, error) {
	if len(token) > MaxTokenBytes {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, MaxTokenBytes)
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64url", ErrMalformed)
	}
	if len(raw) < minRaw {
		return nil, fmt.Errorf("%w: too short", ErrMalformed)
	}
	msg, mac := raw[:len(raw)-macBytes], raw[len(raw)-macBytes:]
	var buf [macBytes]byte
	if !hmac.Equal(s.sum(buf[:0], msg), mac) {
		return nil, ErrForged
	}
	switch {
	case msg[0] == v:
	case msg[0] == version:
		return nil, fmt.Errorf("%w: a refund's reservation, not a lease", ErrMalformed)
	case msg[0] == leaseVersion:
		return nil, fmt.Errorf("%w: a lease, not a refund's reservation", ErrMalformed)
	default:
		return nil, fmt.Errorf("%w: version %d", ErrMalformed, msg[0])
	}
	nameBytes := IDBytes
	if v == leaseVersion {
		nameBytes = seqBytes
	}
	header := 1 + 8 + 8 + 8 + nameBytes + TagBytes
	if len(msg) < header {
		return nil, fmt.Errorf("%w: too short", ErrMalformed)
	}
	c.At = time.Unix(0, int64(binary.BigEndian.Uint64(msg[1:])))
	c.Until = time.Unix(0, int64(binary.BigEndian.Uint64(msg[9:])))
	c.Cost = int64(binary.BigEndian.Uint64(msg[17:]))
	name := msg[25 : 25+nameBytes]
	copy(c.Tier[:], msg[25+nameBytes:header])
	rest := msg[header:]
	var ok bool
	if c.Policy, rest, ok = field(rest); ok {
		c.Key, rest, ok = field(rest)
	}
	if !ok || len(rest) != 0 || c.Cost < 1 || !c.Until.After(c.At) {
		return nil, fmt.Errorf("%w: bad fields", ErrMalformed)
	}
	if !now.Before(c.Until) {
		return nil, fmt.Errorf("%w at %s", ErrExpired, c.Until.UTC().Format(time.RFC3339Nano))
	}
	return name, nil
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
