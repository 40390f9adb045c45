package redis

import (
	"fmt"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// derivedKey is one key the store writes for a client: a limit's state, the client's reset
// mark, or a refund record.
type derivedKey struct {
	kind           string // "limit", "reset" or "refund"
	policy, client string
	name           string   // the limit's (kind "limit")
	id             [16]byte // the refund's (kind "refund")
}

func (d derivedKey) redisKey() string {
	switch d.kind {
	case "limit":
		return LimitKey(d.policy, d.client, d.name)
	case "reset":
		return Key(d.policy, d.client) + resetSuffix
	default:
		return Key(d.policy, d.client) + refundSuffix(d.id)
	}
}

// derived returns every kind of key the store writes for (policy, client), with the limit name
// and the refund ID given.
func derived(policy, client, name string, id [16]byte) []derivedKey {
	return []derivedKey{
		{kind: "limit", policy: policy, client: client, name: name},
		{kind: "reset", policy: policy, client: client},
		{kind: "refund", policy: policy, client: client, id: id},
	}
}

// hashTag returns what Redis Cluster hashes of key: between the first '{' and the first '}'
// after it, if that is not empty, else the whole key.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

// globMatchesPrefix reports whether SCAN's MATCH pattern, an escaped literal followed by one
// '*' (what Store.limitKeys sends), matches key, by Redis's rules: a backslash takes the next
// byte literally. It fails t if the pattern holds any other unescaped glob character.
func globMatchesPrefix(t *testing.T, pattern, key string) bool {
	t.Helper()
	var lit strings.Builder
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; {
		case c == '\\' && i+1 < len(pattern):
			i++
			lit.WriteByte(pattern[i])
		case c == '*' && i == len(pattern)-1:
			return strings.HasPrefix(key, lit.String())
		case strings.IndexByte(`*?[]\`, c) >= 0:
			t.Fatalf("pattern %q: unescaped %q at %d", pattern, c, i)
		default:
			lit.WriteByte(c)
		}
	}
	t.Fatalf("pattern %q does not end with '*'", pattern)
	return false
}

// checkKeys checks, for the keys two (policy, client, name, refund ID) inputs derive, that the
// store's key scheme is injective and keeps each client to itself: two derived keys are equal
// only if they are the same kind of key of the same inputs; every key of a client has the hash
// tag of the client's own key (its slot), and the tags of two distinct (policy, client) pairs
// differ; and a reset's SCAN pattern matches the limit keys of its own client only, none of
// another client's, and no reset mark or refund record.
func checkKeys(t *testing.T, a, b []derivedKey) {
	t.Helper()
	for _, x := range a {
		for _, y := range b {
			kx, ky := x.redisKey(), y.redisKey()
			if (kx == ky) != (x == y) {
				t.Fatalf("%+v and %+v: keys %q and %q (equal: %t)", x, y, kx, ky, kx == ky)
			}
			samePair := x.policy == y.policy && x.client == y.client
			if tx, ty := hashTag(kx), hashTag(ky); (tx == ty) != samePair {
				t.Fatalf("%q and %q: hash tags %q and %q, same client: %t", kx, ky, tx, ty, samePair)
			}
			if tx, own := hashTag(kx), hashTag(Key(x.policy, x.client)); tx != own {
				t.Fatalf("%q: hash tag %q, the client's key's %q", kx, tx, own)
			}
			pattern := globEscape(Key(x.policy, x.client)) + ":*"
			if got, want := globMatchesPrefix(t, pattern, ky), samePair && y.kind == "limit" && y.name != limiter.DefaultLimitName; got != want {
				t.Fatalf("reset pattern %q of client %q matches %q (%+v): %t, want %t", pattern, x.client, ky, y, got, want)
			}
		}
	}
}

// validName maps a fuzzed name to one NewStack accepts: non-empty, no byte 0xFF.
func validName(name string) string {
	name = strings.ReplaceAll(name, "\xff", "")
	if name == "" {
		return limiter.DefaultLimitName
	}
	return name
}

func refundID(b []byte) (id [16]byte) {
	copy(id[:], b)
	return id
}

// TestKeyCollisionsCrafted tries the inputs that an escaping scheme most often confuses: the
// escaped bytes themselves and their escapes written literally, keys that end where a suffix
// begins (':' and a name, "#reset", "#refund:"), names that look like a suffix, and the
// separator between policy and client moved from one to the other.
func TestKeyCollisionsCrafted(t *testing.T) {
	id := refundID([]byte("0123456789abcdef"))
	hexID := refundSuffix(id)[len("#refund:"):]
	policies := []string{"ns/p", "ns/p\x00", "ns/p%00", "ns", "ns/p}", "ns/p%7D", "ns/p{", "ns/p%7B", "ns/p%", "ns/p%25", ""}
	clients := []string{
		"", "a", "a}", "a%7D", "a{", "a%7B", "a%", "a%25", "a%2525", "a\x00", "a%00", "\x00a", "p\x00a",
		"a:burst", "a}:burst", "a%7D:burst", "a#reset", "a}#reset", "a%7D#reset",
		"a#refund:" + hexID, "a}#refund:" + hexID, "a%7D#refund:" + hexID,
		"{a}", "}{", "%7D%7B", "a:", "a:default", "*", "a*", "a?", "a[b]", `a\`, `a\*`,
	}
	names := []string{limiter.DefaultLimitName, "burst", ":burst", "b:urst", "#reset", "reset", "#refund:" + hexID, "}", "{x}", "%7D", "*", ""}
	// Injective over every input: no two derived keys are equal.
	seen := map[string]derivedKey{}
	for _, p := range policies {
		for _, c := range clients {
			for _, n := range names {
				for _, d := range derived(p, c, validName(n), id) {
					k := d.redisKey()
					if prev, ok := seen[k]; ok && prev != d {
						t.Fatalf("%+v and %+v: both key %q", prev, d, k)
					}
					seen[k] = d
				}
			}
		}
	}
	// Slots and reset patterns, for every two (policy, client) pairs of the first policies.
	var pairs [][]derivedKey
	for _, p := range policies[:4] {
		for i, c := range clients {
			pairs = append(pairs, derived(p, c, validName(names[i%len(names)]), id))
		}
	}
	for _, a := range pairs {
		for _, b := range pairs {
			checkKeys(t, a, b)
		}
	}
	t.Logf("%d distinct keys; %d pairs of clients", len(seen), len(pairs)*len(pairs))
	// One refund ID against another, on one client.
	checkKeys(t, derived("ns/p", "a", "burst", id), derived("ns/p", "a", "burst", refundID([]byte("0123456789abcdeg"))))
}

// FuzzKeyInjective checks the key scheme (checkKeys) for any two inputs: any bytes in the
// policy ID and the client key, any name NewStack accepts, any refund ID.
func FuzzKeyInjective(f *testing.F) {
	f.Add("ns/p", "a", "burst", []byte("id"), "ns/p", "a}:burst", "default", []byte("id"))
	f.Add("ns/p", "a#reset", "default", []byte{}, "ns/p", "a", "default", []byte{})
	f.Add("ns/p\x00a", "b", "x", []byte{1}, "ns/p", "a\x00b", "x", []byte{1})
	f.Add("ns/p", "a%7D", "x", []byte{}, "ns/p", "a}", "x", []byte{})
	f.Add("ns/p", "a", ":x", []byte{}, "ns/p", "a", "x", []byte{})
	f.Add("ns/p", "a\\*", "x", []byte{}, "ns/p", "a\\", "x", []byte{})
	f.Fuzz(func(t *testing.T, p1, c1, n1 string, id1 []byte, p2, c2, n2 string, id2 []byte) {
		a := derived(p1, c1, validName(n1), refundID(id1))
		b := derived(p2, c2, validName(n2), refundID(id2))
		checkKeys(t, a, b)
		checkKeys(t, b, a)
		checkKeys(t, a, a)
	})
}

// TestHashTag checks hashTag, which the key tests rely on, by Redis Cluster's examples.
func TestHashTag(t *testing.T) {
	for key, want := range map[string]string{
		"{user1000}.following": "user1000", "foo{}{bar}": "foo{}{bar}", "foo{{bar}}zap": "{bar",
		"foo{bar}{zap}": "bar", "plain": "plain",
	} {
		if got := hashTag(key); got != want {
			t.Errorf("hashTag(%q) = %q, want %q", key, got, want)
		}
	}
	if got := fmt.Sprint(hashTag(Key("a{b", "c}d"))); got != "a%7Bb\x00c%7Dd" {
		t.Errorf("hash tag of a crafted key: %q", got)
	}
}
