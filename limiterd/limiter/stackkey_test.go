package limiter

import (
	"strings"
	"testing"
)

// keysOver returns every string of up to n bytes over alphabet.
func keysOver(alphabet string, n int) []string {
	keys := []string{""}
	for prev := keys; n > 0; n-- {
		var next []string
		for _, k := range prev {
			for i := range len(alphabet) {
				next = append(next, k+alphabet[i:i+1])
			}
		}
		keys, prev = append(keys, next...), next
	}
	return keys
}

// TestIsStackKeyOfIsExact checks, for every client key of up to 6 bytes over 'a', ':' and 0xFF
// and names made of the same bytes but 0xFF, that a stack key belongs to its own client only,
// and that no client's stored key is taken for a stack key: what lets Memory.Reset find a
// client's limits by their keys without forgetting a neighbour's, however keys are crafted.
func TestIsStackKeyOfIsExact(t *testing.T) {
	clients := keysOver("a:\xff", 6)
	names := []string{"a", ":", "aa", "a:", DefaultLimitName}
	for _, c := range clients {
		key := storedKey(c)
		for _, other := range clients {
			if isStackKeyOf(storedKey(other), key) {
				t.Fatalf("client %q's own state is taken for a stack key of client %q", other, c)
			}
			for _, name := range names {
				sk := string(appendStackKey(nil, storedKey(other), name))
				if got := isStackKeyOf(sk, key); got != (other == c) {
					t.Fatalf("isStackKeyOf(limit %q of client %q, client %q) = %t", name, other, c, got)
				}
			}
		}
	}
}

// FuzzIsStackKeyOf checks the same for any two clients and any name NewStack accepts.
func FuzzIsStackKeyOf(f *testing.F) {
	f.Add("a", "a\xff", "burst")
	f.Add("a\xff", "a\xff\xff", "x")
	f.Add("", "\xff", "a")
	f.Fuzz(func(t *testing.T, c, other, name string) {
		if name == "" || strings.IndexByte(name, 0xFF) >= 0 {
			return // NewStack refuses it
		}
		sk := string(appendStackKey(nil, storedKey(other), name))
		if got := isStackKeyOf(sk, storedKey(c)); got != (other == c) {
			t.Fatalf("isStackKeyOf(limit %q of client %q, client %q) = %t", name, other, c, got)
		}
		if isStackKeyOf(storedKey(other), storedKey(c)) {
			t.Fatalf("client %q's own state is taken for a stack key of client %q", other, c)
		}
	})
}
