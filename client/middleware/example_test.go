package middleware_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/client/middleware"
)

// subjectKey is the context key under which authentication puts the verified subject.
type subjectKey struct{}

// authenticate stands for the application's authentication: it verifies the caller's token
// (here a fixed table; in production a signature and its claims) and puts the token's subject
// in the request's context. A request without a valid token goes on anonymous.
func authenticate(next http.Handler) http.Handler {
	subjects := map[string]string{"Bearer t0k3n-of-alice": "alice"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s, ok := subjects[r.Header.Get("Authorization")]; ok {
			r = r.WithContext(context.WithValue(r.Context(), subjectKey{}, s))
		}
		next.ServeHTTP(w, r)
	})
}

func ExampleNew() {
	// A client of limiterd's real decisions API with default/api loaded (2 requests per client,
	// then 1 a second); in production: client.New("http://limiterd.limits.svc:8080", ...).
	c, stop, err := newLimiterd(apiPolicy, client.WithPolicy("default/api"))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	orders := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "orders\n") })
	// Authenticated requests are limited per verified subject (key "sub:alice"), the others
	// per address (key "ip:198.51.100.23"), behind a load balancer in 10.0.0.0/8 whose
	// X-Forwarded-For is trusted. Neither key is one the caller can choose.
	subject := func(r *http.Request) (string, bool) {
		s, ok := r.Context().Value(subjectKey{}).(string)
		return s, ok
	}
	limit := middleware.New(c,
		middleware.KeyBy(middleware.FirstOf(
			middleware.Source("sub", subject),
			middleware.ClientIP(netip.MustParsePrefix("10.0.0.0/8")))),
		middleware.FailOpen(true), // when limiterd is unreachable or fails; never on a 4xx
		middleware.OnError(func(r *http.Request, err error) { log.Printf("limiterd: %v", err) }))
	h := authenticate(limit(orders))

	for _, token := range []string{"Bearer t0k3n-of-alice", "Bearer t0k3n-of-alice", "Bearer t0k3n-of-alice", ""} {
		r := httptest.NewRequest(http.MethodGet, "/orders", nil)
		r.RemoteAddr = "10.0.0.7:34567"
		r.Header.Set("X-Forwarded-For", "198.51.100.23")
		if token != "" {
			r.Header.Set("Authorization", token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Print(w.Code, " RateLimit: ", w.Header().Get("RateLimit"), " Retry-After: ", w.Header().Get("Retry-After"), " ", w.Body.String())
	}
	// Output:
	// 200 RateLimit: "standard";r=1;t=1 Retry-After:  orders
	// 200 RateLimit: "standard";r=0;t=2 Retry-After:  orders
	// 429 RateLimit: "standard";r=0;t=2 Retry-After: 1 {"error":"rate limited","retryAfterSeconds":1}
	// 200 RateLimit: "standard";r=1;t=1 Retry-After:  orders
}
