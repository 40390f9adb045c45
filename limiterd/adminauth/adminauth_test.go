package adminauth

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
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

	for _, bad := range []string{"short", "short", "0123456789abcdef 01"} {
		write(bad)
		now = now.Add(TokenRecheck)
		if !authenticates(rotated) {
			t.Fatalf("content %q: the last good token is refused", bad)
		}
	}
	if n := strings.Count(logs.String(), "admin token file not applied"); n != 2 {
		t.Errorf("%d refusals logged for two bad contents, one of them read twice: %q", n, logs.String())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	now = now.Add(TokenRecheck)
	if !authenticates(rotated) {
		t.Fatal("a removed file: the last good token is refused")
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
