package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// fakeReviews is an API server that answers TokenReviews ("token-<user>" is <user>) and
// SubjectAccessReviews (allowed: the user names allowed get /metrics).
func fakeReviews(t *testing.T, allowed map[string]bool) *rest.Config {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var tr authenticationv1.TokenReview
			if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var name string
			_, err := fmt.Sscanf(tr.Spec.Token, "token-%s", &name)
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: err == nil, User: authenticationv1.UserInfo{Username: name}}
			tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
			_ = json.NewEncoder(w).Encode(&tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var sar authorizationv1.SubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			na := sar.Spec.NonResourceAttributes
			sar.Status.Allowed = allowed[sar.Spec.User] && na != nil && na.Verb == "get" && na.Path == "/metrics"
			sar.APIVersion, sar.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
			_ = json.NewEncoder(w).Encode(&sar)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}
}

// TestMetricsNeedAuthorization serves the operator's metrics as run configures them: over
// HTTPS, a scrape without a token answers 401, one whose user may not get /metrics 403, and one
// who may 200. Before, the metrics were served over HTTP to anyone.
func TestMetricsNeedAuthorization(t *testing.T) {
	cfg := fakeReviews(t, map[string]bool{"prometheus": true})
	addr := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(metricsOptions(addr, true), cfg, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("metrics server: %v", err)
		}
	})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the operator's self-signed certificate
	}}
	scrape := func(scheme, token string) (int, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, scheme+"://"+addr+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, nil
	}
	testsupport.Eventually(t, 30*time.Second, "the metrics server", func() error {
		_, err := scrape("https", "")
		return err
	})
	for _, c := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"token-alice", http.StatusForbidden}, {"token-prometheus", http.StatusOK}} {
		if status, err := scrape("https", c.token); err != nil || status != c.want {
			t.Errorf("scrape with token %q: %d %v, want %d", c.token, status, err, c.want)
		}
	}
	// A token the review does not authenticate is refused (controller-runtime's filter answers
	// 401 or, for some review answers, 500).
	if status, err := scrape("https", "not-a-token"); err != nil || status < 400 {
		t.Errorf("scrape with a token the review refuses: %d %v, want refused", status, err)
	}
	if status, err := scrape("http", ""); err == nil && status == http.StatusOK {
		t.Error("metrics served over plain HTTP")
	}
}
