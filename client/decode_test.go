package client

import (
	"net/http"
	"testing"
)

// FuzzDecode feeds arbitrary answers to the decoder of limiterd's decisions: it never panics, and
// a decision it accepts is consistent with its status and has no negative duration, no
// unnamed limit, and a lease only with its token.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"allowed":true,"limit":2,"remaining":1,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":1000,"retryAfterMs":0}`,
		`{"allowed":false,"limit":3,"remaining":0,"resetAfterSeconds":3600,"retryAfterSeconds":3596,"resetAfterMs":3598000,"retryAfterMs":3596000,` +
			`"limits":[{"name":"burst","allowed":true,"limit":2,"remaining":2,"resetAfterSeconds":0,"resetAfterMs":0},` +
			`{"name":"daily","allowed":false,"limit":3,"remaining":0,"resetAfterSeconds":3598,"resetAfterMs":3598000}]}`,
		`{"allowed":true,"limit":null,"remaining":null,"resetAfterSeconds":0,"retryAfterSeconds":0}`,
		`{"allowed":true,"limits":[{"name":"a","allowed":true,"resetAfterSeconds":9223372036854775807}]}`,
		`{"allowed":true,"limits":[{}]}`,
		`{"allowed":true,"limits":null}`,
		`{"allowed":false,"retryAfterMs":-1}`,
		`{"allowed":true,"limit":3,"remaining":2,"resetAfterSeconds":60,"retryAfterSeconds":0,"resetAfterMs":60000,"retryAfterMs":0,` +
			`"lease":"AwAAAA","leaseExpiresAt":"2030-01-02T03:05:05Z","leaseTimeoutMs":60000}`,
		`{"allowed":true,"lease":"AwAAAA","leaseExpiresAt":"yesterday","leaseTimeoutMs":60000}`,
		`{"allowed":true,"lease":"AwAAAA","leaseExpiresAt":"2030-01-02T03:05:05.5Z"}`,
	} {
		f.Add(seed, true)
		f.Add(seed, false)
	}
	f.Fuzz(func(t *testing.T, body string, ok bool) {
		status := http.StatusOK
		if !ok {
			status = http.StatusTooManyRequests
		}
		d, err := decode(httpAnswer{status: status, header: http.Header{}, data: []byte(body)})
		if err != nil {
			return
		}
		if d.Allowed != ok || d.ResetAfter < 0 || d.RetryAfter < 0 {
			t.Fatalf("status %d, %q: accepted %+v", status, body, d)
		}
		if (d.Lease.Token == "") != (d.Lease == Lease{}) || d.Lease.Timeout < 0 {
			t.Fatalf("%q: accepted the lease %+v", body, d.Lease)
		}
		for _, l := range d.Limits {
			if l.Name == "" || l.ResetAfter < 0 {
				t.Fatalf("%q: accepted the limit %+v", body, l)
			}
		}
	})
}
