package middleware_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/client/middleware"
)

func ExampleNew() {
	// A client of limiterd's real decisions API with default/api loaded (2 requests per client,
	// then 1 a second); in production: client.New("http://limiterd.limits.svc:8080", ...).
	c, stop, err := newLimiterd(apiPolicy, client.WithPolicy("default/api"))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	orders := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "orders\n") })
	// Behind a load balancer in 10.0.0.0/8: the client is the address it forwards for.
	limit := middleware.New(c,
		middleware.KeyBy(middleware.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))),
		middleware.FailOpen(true),
		middleware.OnError(func(r *http.Request, err error) { log.Printf("limiterd: %v", err) }))
	h := limit(orders)

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/orders", nil)
		r.RemoteAddr = "10.0.0.7:34567"
		r.Header.Set("X-Forwarded-For", "198.51.100.23")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Print(w.Code, " RateLimit: ", w.Header().Get("RateLimit"), " Retry-After: ", w.Header().Get("Retry-After"), " ", w.Body.String())
	}
	// Output:
	// 200 RateLimit: "standard";r=1;t=1 Retry-After:  orders
	// 200 RateLimit: "standard";r=0;t=2 Retry-After:  orders
	// 429 RateLimit: "standard";r=0;t=2 Retry-After: 1 {"error":"rate limited","retryAfterSeconds":1}
}
