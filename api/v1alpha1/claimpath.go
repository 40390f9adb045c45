package v1alpha1

import "strings"

// JWTClaimPath returns the names of the path of a JWTClaim source's claim: claimPath, else
// claim split at its dots; nil when neither is set. The two forms of one path give the same
// names, so that what reads a claim knows one form.
func (k *KeySource) JWTClaimPath() []string {
	switch {
	case k.ClaimPath != nil:
		return k.ClaimPath
	case k.Claim != "":
		return strings.Split(k.Claim, ".")
	}
	return nil
}

// isClaimPath reports whether s is the claim of a JWTClaim key source: 1 to MaxClaimDepth
// non-empty names of letters, digits, '_' and '-', separated by '.'.
func isClaimPath(s string) bool {
	names, n := 1, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if n == 0 {
				return false
			}
			names, n = names+1, 0
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
			n++
		default:
			return false
		}
	}
	return n > 0 && names <= MaxClaimDepth
}

// isClaimName reports whether s is a name of a JWTClaim key source's claimPath: 1 or more
// letters, digits and -._~:/ (the unreserved characters of a URI, and the ':' and '/' of URI
// and URN claim names such as "https://example.com/tenant" and "cognito:username"). The length
// is checked apart, against MaxClaimLength.
func isClaimName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == ':', c == '/':
		default:
			return false
		}
	}
	return true
}
