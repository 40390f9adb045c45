package adminauth

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/rest"
)

const goodToken = "0123456789abcdef-token"

func request(token string) *http.Request {
	r := httptest.NewRequest(http.MethodDelete, "/v1/clients?key=k", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

// tokenFile returns a TokenFile of a file holding content, and the file's path.
func tokenFile(t *testing.T, content string) (*TokenFile, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	tf, err := LoadTokenFile(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return tf, path
}

func TestToken(t *testing.T) {
	tf, _ := tokenFile(t, goodToken)
	a := Token(tf)
	for _, bad := range []string{"", "wrong", goodToken + "x", goodToken[:len(goodToken)-1]} {
		if _, err := a.Authenticate(request(bad)); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("token %q: %v, want ErrUnauthenticated", bad, err)
		}
	}
	u, err := a.Authenticate(request(goodToken))
	if err != nil || u.GetName() != TokenUser {
		t.Fatalf("the token: %v, %v", u, err)
	}
	for _, attrs := range []authorizer.AttributesRecord{PolicyClients(u, "delete", "a", "api"), ListPolicies(u, "b"), Path(u, "get", "/metrics")} {
		if ok, _, err := a.Authorize(t.Context(), attrs); !ok || err != nil {
			t.Errorf("the token's user may not %s: %v", describe(attrs), err)
		}
	}
	other := &user.DefaultInfo{Name: "alice"}
	if ok, _, _ := a.Authorize(t.Context(), PolicyClients(other, "delete", "a", "api")); ok {
		t.Error("another user is authorized by the token's Auth")
	}
}

func TestLoadTokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	for _, c := range []struct {
		content string
		ok      bool
	}{
		{"\n " + goodToken + "\n", true},
		{"", false},
		{"short\n", false},
		{"0123456789abcdef 01", false},
	} {
		if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadTokenFile(path, slog.New(slog.DiscardHandler))
		if c.ok && err != nil {
			t.Errorf("%q: %v", c.content, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), path)) {
			t.Errorf("%q: %v, want an error naming the file", c.content, err)
		}
	}
	if _, err := LoadTokenFile(filepath.Join(dir, "missing"), slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a missing file accepted")
	}
}

// TestTokenFileRotates: a rewritten token file is honoured at the next request after
// TokenRecheck, and the old token refused, without a restart; content that is not a valid token
// is logged and leaves the last good token in force. Before, the file was read once at start:
// rotating the token needed a restart, and until then the old token still worked.
func TestTokenFileRotates(t *testing.T) {
	tf, path := tokenFile(t, goodToken)
	var logs strings.Builder
	tf.log = slog.New(slog.NewTextHandler(&logs, nil))
	now := time.Unix(1_700_000_000, 0)
	tf.now = func() time.Time { return now }
	tf.checked = now // as if loaded at now
	a := Token(tf)
	authenticates := func(token string) bool {
		_, err := a.Authenticate(request(token))
		return err == nil
	}
	write := func(content string) {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	const rotated = "fedcba9876543210-rotated"
	write(rotated + "\n")
	now = now.Add(TokenRecheck - 1)
	if !authenticates(goodToken) || authenticates(rotated) {
		t.Fatal("the file was read again before TokenRecheck")
	}
	now = now.Add(1)
	if !authenticates(rotated) {
		t.Fatal("the rotated token is refused after TokenRecheck")
	}
	if authenticates(goodToken) {
		t.Fatal("the old token still authenticates after the rotation")
	}
	if !strings.Contains(logs.String(), "admin token reloaded") {
		t.Errorf("the reload is not logged: %q", logs.String())
	}

	// Content that is no valid token revokes the token in force, until a valid one is written.
	for _, bad := range []string{"short", "short", "0123456789abcdef 01"} {
		write(bad)
		now = now.Add(TokenRecheck)
		if authenticates(rotated) || authenticates(bad) {
			t.Fatalf("content %q: a token is still accepted", bad)
		}
	}
	if n := strings.Count(logs.String(), "admin token file holds no valid token"); n != 2 {
		t.Errorf("%d refusals logged for two bad contents, one of them read twice: %q", n, logs.String())
	}
	write(rotated)
	now = now.Add(TokenRecheck)
	if !authenticates(rotated) {
		t.Fatal("the token is refused after the file holds it again")
	}
}

// TestTokenFileRevokes: deleting or emptying the token file revokes the token at the next
// request after TokenRecheck. Before, the last good token stayed in force for as long as the
// process ran.
func TestTokenFileRevokes(t *testing.T) {
	for name, revoke := range map[string]func(path string) error{
		"deleted": os.Remove,
		"emptied": func(path string) error { return os.WriteFile(path, nil, 0o600) },
		"blank":   func(path string) error { return os.WriteFile(path, []byte(" \n"), 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			tf, path := tokenFile(t, goodToken)
			now := time.Unix(1_700_000_000, 0)
			tf.now = func() time.Time { return now }
			tf.checked = now
			a := Token(tf)
			if _, err := a.Authenticate(request(goodToken)); err != nil {
				t.Fatal(err)
			}
			if err := revoke(path); err != nil {
				t.Fatal(err)
			}
			now = now.Add(TokenRecheck)
			for _, token := range []string{goodToken, "", "x"} {
				if u, err := a.Authenticate(request(token)); !errors.Is(err, ErrUnauthenticated) {
					t.Errorf("token %q after the file was %s: %v %v, want ErrUnauthenticated", token, name, u, err)
				}
			}
		})
	}
}

func TestWithToken(t *testing.T) {
	// The other Auth knows alice, who may only get.
	alice := &user.DefaultInfo{Name: "alice"}
	base := New(authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		if r.Header.Get("Authorization") == "Bearer alice-token" {
			return &authenticator.Response{User: alice}, true, nil
		}
		return nil, false, nil
	}), authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		if a.GetUser().GetName() == "alice" && a.GetVerb() == "get" {
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "", nil
	}), "base")
	tf, _ := tokenFile(t, goodToken)
	a, err := base.WithToken(tf)
	if err != nil {
		t.Fatal(err)
	}
	if a.Mode() != "base+token" {
		t.Errorf("mode %q", a.Mode())
	}
	u, err := a.Authenticate(request("alice-token"))
	if err != nil || u.GetName() != "alice" {
		t.Fatalf("alice: %v %v", u, err)
	}
	if ok, _, _ := a.Authorize(t.Context(), PolicyClients(u, "delete", "a", "api")); ok {
		t.Error("alice may delete")
	}
	if ok, _, _ := a.Authorize(t.Context(), PolicyClients(u, "get", "a", "api")); !ok {
		t.Error("alice may not get")
	}
	if u, err = a.Authenticate(request(goodToken)); err != nil || u.GetName() != TokenUser {
		t.Fatalf("the token: %v %v", u, err)
	}
	if ok, _, _ := a.Authorize(t.Context(), PolicyClients(u, "delete", "a", "api")); !ok {
		t.Error("the token may not delete")
	}
	if _, err := a.Authenticate(request("nobody")); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("an unknown token: %v", err)
	}
}

func TestOpen(t *testing.T) {
	a := Open()
	u, err := a.Authenticate(request(""))
	if err != nil || u.GetName() != user.Anonymous {
		t.Fatalf("Open: %v %v", u, err)
	}
	if ok, _, err := a.Authorize(t.Context(), PolicyClients(u, "delete", "a", "api")); !ok || err != nil {
		t.Errorf("Open refuses: %v", err)
	}
}

// fakeAPIServer answers TokenReviews with users (token → user) and SubjectAccessReviews with
// allowed (user name → verbs allowed on anything), and records the users it was asked about.
type fakeAPIServer struct {
	users   map[string]authenticationv1.UserInfo
	allowed map[string][]string

	mu     sync.Mutex
	asked  []string // the users of the SubjectAccessReviews, in order
	config *rest.Config
	srv    *httptest.Server
}

func newFakeAPIServer(t *testing.T, users map[string]authenticationv1.UserInfo, allowed map[string][]string) *fakeAPIServer {
	t.Helper()
	f := &fakeAPIServer{users: users, allowed: allowed}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var tr authenticationv1.TokenReview
			if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			u, ok := f.users[tr.Spec.Token]
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: ok, User: u}
			tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
			_ = json.NewEncoder(w).Encode(&tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var sar authorizationv1.SubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			f.mu.Lock()
			f.asked = append(f.asked, sar.Spec.User)
			f.mu.Unlock()
			verb := ""
			if sar.Spec.ResourceAttributes != nil {
				verb = sar.Spec.ResourceAttributes.Verb
			} else if sar.Spec.NonResourceAttributes != nil {
				verb = sar.Spec.NonResourceAttributes.Verb
			}
			sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: slices.Contains(f.allowed[sar.Spec.User], verb)}
			sar.APIVersion, sar.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
			_ = json.NewEncoder(w).Encode(&sar)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	f.config, f.srv = &rest.Config{Host: srv.URL}, srv
	return f
}

func (f *fakeAPIServer) askedAbout() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.asked)
}

// TestKubernetesPrivilegedGroupNeedsReview: an identity that the TokenReview puts in
// PrivilegedGroup, or names TokenUser, is authorized by a SubjectAccessReview like any other,
// with or without a static token; only the static token's own user is admitted without one.
// Before, the privileged-groups authorizer of WithToken admitted every member of the group, and
// a TokenReview answer in group limiterd:admins was full admin with no review.
func TestKubernetesPrivilegedGroupNeedsReview(t *testing.T) {
	api := newFakeAPIServer(t, map[string]authenticationv1.UserInfo{
		"mallory-token":  {Username: "mallory", Groups: []string{PrivilegedGroup, user.AllAuthenticated}},
		"impostor-token": {Username: TokenUser, Groups: []string{PrivilegedGroup, user.AllAuthenticated}},
		"alice-token":    {Username: "alice", Groups: []string{user.AllAuthenticated}},
	}, map[string][]string{"alice": {"get"}})
	// Two Auths of their own, each with its own cache of reviews.
	kube, err := Kubernetes(api.config, KubernetesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := Kubernetes(api.config, KubernetesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tf, _ := tokenFile(t, goodToken)
	withToken, err := other.WithToken(tf)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*Auth{kube, withToken} {
		t.Run(a.Mode(), func(t *testing.T) {
			for _, token := range []string{"mallory-token", "impostor-token"} {
				u, err := a.Authenticate(request(token))
				if err != nil {
					t.Fatalf("%s: %v", token, err)
				}
				before := len(api.askedAbout())
				for _, attrs := range []authorizer.AttributesRecord{PolicyClients(u, "delete", "a", "api"), Path(u, "get", "/metrics")} {
					if ok, _, err := a.Authorize(t.Context(), attrs); ok || err != nil {
						t.Errorf("%s (user %q in %v) may %s: %v", token, u.GetName(), u.GetGroups(), describe(attrs), err)
					}
				}
				if asked := api.askedAbout()[before:]; len(asked) != 2 || asked[0] != u.GetName() {
					t.Errorf("%s: SubjectAccessReviews asked about %v, want 2 about %q", token, asked, u.GetName())
				}
			}
			u, err := a.Authenticate(request("alice-token"))
			if err != nil {
				t.Fatal(err)
			}
			if ok, _, err := a.Authorize(t.Context(), PolicyClients(u, "get", "a", "api")); !ok || err != nil {
				t.Errorf("alice may not get, which the review allows: %v", err)
			}
		})
	}
	// The static token's user is admitted without a review.
	u, err := withToken.Authenticate(request(goodToken))
	if err != nil || u.GetName() != TokenUser {
		t.Fatalf("the token: %v %v", u, err)
	}
	before := len(api.askedAbout())
	if ok, _, err := withToken.Authorize(t.Context(), PolicyClients(u, "delete", "a", "api")); !ok || err != nil {
		t.Errorf("the static token may not delete: %v", err)
	}
	if asked := api.askedAbout()[before:]; len(asked) != 0 {
		t.Errorf("the static token's user was reviewed: %v", asked)
	}
}

// TestKubernetesAPIServerUnreachable pins what docs/admin-api.md and SECURITY.md say of an API
// server that cannot be reached: a token not reviewed before is not authenticated (the server
// answers 401, as kube-apiserver does), a token reviewed within TokenCacheTTL still is, and an
// action whose SubjectAccessReview cannot be had is an error (the server answers 503).
func TestKubernetesAPIServerUnreachable(t *testing.T) {
	api := newFakeAPIServer(t, map[string]authenticationv1.UserInfo{
		"alice-token": {Username: "alice"},
		"bob-token":   {Username: "bob"},
	}, map[string][]string{"alice": {"get"}})
	kube, err := Kubernetes(api.config, KubernetesOptions{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	alice, err := kube.Authenticate(request("alice-token"))
	if err != nil {
		t.Fatalf("alice while the API server answers: %v", err)
	}
	api.srv.Close()

	if u, err := kube.Authenticate(request("bob-token")); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a token never reviewed, API server unreachable: %v %v, want ErrUnauthenticated", u, err)
	}
	if u, err := kube.Authenticate(request("alice-token")); err != nil || u.GetName() != "alice" {
		t.Errorf("a token reviewed a moment ago, API server unreachable: %v %v, want alice from the cache", u, err)
	}
	if ok, _, err := kube.Authorize(t.Context(), PolicyClients(alice, "get", "a", "api")); ok || err == nil {
		t.Errorf("an action never reviewed, API server unreachable: allowed %v, error %v; want an error", ok, err)
	}
}

// TestOpenLoopbackHost: OpenLoopback admits requests to loopback names only, so that a web page
// cannot reach the unauthenticated admin API by DNS rebinding.
func TestOpenLoopbackHost(t *testing.T) {
	a := OpenLoopback()
	for host, ok := range map[string]bool{
		"localhost": true, "localhost:9090": true, "LocalHost:1": true, "127.0.0.1": true, "127.0.0.1:9090": true,
		"127.0.0.2:80": true, "[::1]": true, "[::1]:9090": true,
		"": false, "attacker.example": false, "attacker.example:9090": false, "localhost.attacker.example:9090": false,
		"10.0.0.1:9090": false, "[::2]:9090": false, "0.0.0.0:9090": false, "127.0.0.1.nip.io": false,
		"[fe80::1%lo]:9090": false, "[::1%25lo]": false, "localhost.:9090": true, "localhost:http": false,
		"::1": false, "[127.0.0.1]": false, // RFC 3986: IPv6 in brackets, only
	} {
		r := request("")
		r.Host = host
		_, err := a.Authenticate(r)
		if ok && err != nil {
			t.Errorf("Host %q: %v, want admitted", host, err)
		}
		if !ok && !errors.Is(err, ErrHostNotLoopback) {
			t.Errorf("Host %q: %v, want ErrHostNotLoopback", host, err)
		}
	}
	if r := request(""); r.Host == "" {
		t.Fatal("httptest request without a Host")
	}
	// Open is for --admin-insecure-no-auth, whose listener is not on loopback.
	r := request("")
	r.Host = "limiterd.example:9090"
	if _, err := Open().Authenticate(r); err != nil {
		t.Errorf("Open refuses Host %q: %v", r.Host, err)
	}
}
