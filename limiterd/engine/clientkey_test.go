package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

func TestClientKey(t *testing.T) {
	digest := func(k string) string {
		sum := sha256.Sum256([]byte(k))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	max := strings.Repeat("k", v1alpha1.MaxClientKeyBytes)
	for _, tc := range []struct{ key, want string }{
		{"", ""},
		{"alice", "alice"},
		{max, max},
		{max + "k", digest(max + "k")},
		{strings.Repeat("é", 40<<10), digest(strings.Repeat("é", 40<<10))},
		{"sha256:", digest("sha256:")},
		{digest(max + "k"), digest(digest(max + "k"))}, // the digest form is digested again
		{"SHA256:x", "SHA256:x"},
		{"sha25", "sha25"},
	} {
		if got := ClientKey(tc.key); got != tc.want {
			t.Errorf("ClientKey(%.40q…) = %.80q, want %.80q", tc.key, got, tc.want)
		}
	}
	if n := len(ClientKey(strings.Repeat("x", 1<<20))); n != 71 {
		t.Errorf("a digested key has %d bytes, want 71", n)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = ClientKey(max) }); allocs != 0 {
		t.Errorf("ClientKey of a key kept as itself allocates %v times", allocs)
	}
}
