package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// DigestPrefix starts the stored key of every client whose key is digested (see ClientKey).
const DigestPrefix = "sha256:"

// ClientKey returns the key under which the stores keep the state of the client a caller names
// key, the one rule every path applies (decisions, batches, peeks, refunds, resets, the admin
// API; HTTP and gRPC alike):
//
//   - a key of at most v1alpha1.MaxClientKeyBytes bytes that does not begin with DigestPrefix is
//     stored as itself;
//   - any other key — longer than MaxClientKeyBytes, or beginning with "sha256:" — is stored as
//     "sha256:" followed by the 64 lower-case hexadecimal digits of the SHA-256 of the whole key.
//
// So a key's length never decides whether a request is limited: an over-long key is a client
// like any other, named by its digest (71 bytes), and memory per client stays bounded. Two keys
// share a state only if they are equal or their SHA-256 digests collide. A key in the digest
// form is digested again, so sending "sha256:<digest of K>" reaches a state other than K's:
// reaching the state of a digested key K takes a key whose digest is K's, a SHA-256 preimage.
//
// The tier is resolved on the caller's key, not on the stored one (policy.Policy.Resolve): an
// override names keys of at most MaxClientKeyBytes, so an exact override never names a longer
// key, and a prefix override matches a longer key exactly when it matches its first
// MaxClientKeyBytes bytes.
func ClientKey(key string) string {
	if !digested(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	var b [len(DigestPrefix) + 2*sha256.Size]byte
	copy(b[:], DigestPrefix)
	hex.Encode(b[len(DigestPrefix):], sum[:])
	return string(b[:])
}

// digested reports whether ClientKey stores key as its digest.
func digested(key string) bool {
	return len(key) > v1alpha1.MaxClientKeyBytes || strings.HasPrefix(key, DigestPrefix)
}

// storedKeys returns the stored keys (ClientKey) of a batch's items, by index, or nil when every
// item's key is stored as itself (no allocation then).
func storedKeys(items []BatchItem) []string {
	for i := range items {
		if digested(items[i].Key) {
			keys := make([]string, len(items))
			for j := range items {
				keys[j] = ClientKey(items[j].Key)
			}
			return keys
		}
	}
	return nil
}
