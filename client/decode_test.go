package client

import (
	"net/http"
	"testing"
)

// FuzzDecode feeds arbitrary answers to the decoder of limiterd's decisions: it never panics, and
// a decision it accepts is consistent with its status and has no negative duration and no
// unnamed limit.
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
		for _, l := range d.Limits {
			if l.Name == "" || l.ResetAfter < 0 {
				t.Fatalf("%q: accepted the limit %+v", body, l)
			}
		}
	})
}
