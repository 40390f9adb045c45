package redis

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// KeyPrefix starts every key the store writes.
const KeyPrefix = "limiterd:"

// Key returns the Redis key that holds a client's state under a policy:
// limiterd:{<policy ID>\x00<client key>}, with '%', '{', '}' and NUL percent-escaped in both so
// that the hash tag is exactly the pair.
func Key(policyID, clientKey string) string {
	return keyPrefix(policyID) + keySuffix(clientKey)
}

// LimitKey returns the Redis key that holds the state of a stacked tier's limit for a client:
// Key(policyID, clientKey) for the limit named limiter.DefaultLimitName (the state a tier of one
// limit keeps), else that key followed by ':' and the limit's name. A limit's key has the
// client's hash tag, so every limit of a client is on the cluster slot of its client key, and
// one script can decide them together. Nothing follows the hash tag of Key, so a limit's key is
// no client's key.
func LimitKey(policyID, clientKey, name string) string {
	return keyPrefix(policyID) + keySuffix(clientKey) + limitSuffix(name)
}

// limitSuffix returns what follows a client's key in the key of its limit name.
func limitSuffix(name string) string {
	if name == limiter.DefaultLimitName {
		return ""
	}
	return ":" + name
}

func keyPrefix(policyID string) string {
	var b strings.Builder
	b.WriteString(KeyPrefix + "{")
	escape(&b, policyID)
	b.WriteByte(0)
	return b.String()
}

func keySuffix(clientKey string) string {
	var b strings.Builder
	b.Grow(len(clientKey) + 1)
	escape(&b, clientKey)
	b.WriteByte('}')
	return b.String()
}

// escape writes s with '%', '{', '}' and NUL percent-escaped.
func escape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		case 0:
			b.WriteString("%00")
		default:
			b.WriteByte(c)
		}
	}
}

// fingerprint returns the canonical identity of a strategy's algorithm and parameters, the same
// in every process: what a state records as the strategy that wrote it.
func fingerprint(rl limiter.RateLimiter) string {
	switch rl := rl.(type) {
	case *limiter.TokenBucket:
		capacity, rate, period := rl.Params()
		return fmt.Sprintf("tb:%d:%d:%d", capacity, rate, int64(period))
	case *limiter.SlidingWindow:
		limit, window := rl.Params()
		return fmt.Sprintf("sw:%d:%d", limit, int64(window))
	case *limiter.Quota:
		// The zone's name, query-escaped: no ':' or white space, which end a fingerprint's
		// field or the state's.
		limit, period, loc := rl.Params()
		return fmt.Sprintf("qt:%d:%d:%s", limit, period, url.QueryEscape(loc.String()))
	case *limiter.Concurrency:
		limit, timeout := rl.Params()
		return fmt.Sprintf("cc:%d:%d", limit, int64(timeout))
	default:
		return "unlimited"
	}
}

var errFingerprint = errors.New("unknown strategy fingerprint")

// parseFingerprint returns the strategy a fingerprint names.
func parseFingerprint(fp string) (limiter.RateLimiter, error) {
	if q, ok := strings.CutPrefix(fp, "qt:"); ok {
		return parseQuotaFingerprint(fp, q)
	}
	parts := strings.Split(fp, ":")
	nums := make([]int64, 0, 3)
	for _, p := range parts[1:] {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w %q", errFingerprint, fp)
		}
		nums = append(nums, n)
	}
	var (
		rl  limiter.RateLimiter
		err = errFingerprint
	)
	switch {
	case parts[0] == "tb" && len(nums) == 3:
		rl, err = limiter.NewTokenBucket(nums[0], nums[1], time.Duration(nums[2]))
	case parts[0] == "sw" && len(nums) == 2:
		rl, err = limiter.NewSlidingWindow(nums[0], time.Duration(nums[1]))
	}
	if err != nil {
		return nil, fmt.Errorf("fingerprint %q: %w", fp, err)
	}
	return rl, nil
}

// parseQuotaFingerprint returns the quota the fingerprint fp names; q is what follows "qt:".
func parseQuotaFingerprint(fp, q string) (limiter.RateLimiter, error) {
	parts := strings.Split(q, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%w %q", errFingerprint, fp)
	}
	limit, err1 := strconv.ParseInt(parts[0], 10, 64)
	period, err2 := strconv.ParseUint(parts[1], 10, 8)
	zone, err3 := url.QueryUnescape(parts[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("%w %q: %w", errFingerprint, fp, err)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("fingerprint %q: %w", fp, err)
	}
	rl, err := limiter.NewQuota(limit, limiter.CalendarPeriod(period), loc)
	if err != nil {
		return nil, fmt.Errorf("fingerprint %q: %w", fp, err)
	}
	return rl, nil
}
