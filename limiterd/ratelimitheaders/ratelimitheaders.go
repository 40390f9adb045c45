// Package ratelimitheaders formats the header fields by which limiterd tells a client its quota:
// RateLimit-Policy and RateLimit of draft-ietf-httpapi-ratelimit-headers-10, and Retry-After.
//
//	RateLimit-Policy: "<policy>";q=<quota>;w=<window seconds>[;qu="concurrent-requests"]
//	RateLimit: "<policy>";r=<remaining>;t=<seconds until reset>
//	Retry-After: <seconds>
//
// The policy name is a structured-field String. Durations are whole seconds rounded up, so that
// waiting that long is always enough; a window and a Retry-After are at least 1. The functions
// append to a caller's buffer and never allocate beyond growing it.
package ratelimitheaders

import (
	"strconv"
	"time"
)

// Field names in net/http's canonical form, so that values can be set on an http.Header map
// directly. HTTP/2 and Envoy send them lower-cased; names are case-insensitive.
const (
	RateLimitPolicy = "Ratelimit-Policy"
	RateLimit       = "Ratelimit"
	RetryAfter      = "Retry-After"
)

// AppendPolicy appends a RateLimit-Policy item: the policy name, its quota and the window the
// quota is expressed over (rounded up to whole seconds, at least 1).
func AppendPolicy(b []byte, name string, quota int64, window time.Duration) []byte {
	b = appendString(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, quota, 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, max(1, Seconds(window)), 10)
}

// UnitConcurrentRequests is the quota unit (the draft's qu parameter) of a limit on the
// requests in flight at once, a concurrency limit: its q places are held at once, each until its
// request is released or w passes, rather than q requests per w. Without qu, the unit is
// "request", the draft's default, which every other limit counts.
const UnitConcurrentRequests = "concurrent-requests"

// AppendQuotaUnit appends the qu parameter (a structured-field String) to the RateLimit-Policy
// item AppendPolicy appended last.
func AppendQuotaUnit(b []byte, unit string) []byte {
	b = append(b, ";qu="...)
	return appendString(b, unit)
}

// AppendLimit appends a RateLimit item: the policy name, the remaining quota (0 when negative)
// and the time until the quota is whole again (rounded up to whole seconds).
func AppendLimit(b []byte, name string, remaining int64, reset time.Duration) []byte {
	b = appendString(b, name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(0, remaining), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, Seconds(reset), 10)
}

// AppendRetryAfter appends a Retry-After value: delay-seconds rounded up, at least 1.
func AppendRetryAfter(b []byte, retry time.Duration) []byte {
	return strconv.AppendInt(b, RetryAfterSeconds(retry), 10)
}

// RetryAfterSeconds is the Retry-After of a rejection: retry rounded up to whole seconds, at
// least 1.
func RetryAfterSeconds(retry time.Duration) int64 { return max(1, Seconds(retry)) }

// Seconds rounds d up to whole seconds; it is 0 when d is not positive.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// appendString appends s as a structured-field String (RFC 9651 §3.3.3): printable ASCII in
// quotes with '"' and '\' escaped. Other bytes cannot be represented and are written '?'
// (tier names are DNS labels, so this never happens for limiterd's policies).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
