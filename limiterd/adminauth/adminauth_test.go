package adminauth

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

func TestToken(t *testing.T) {
	a, err := Token(goodToken)
	if err != nil {
		t.Fatal(err)
	}
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
	for _, weak := range []string{"", "short", "0123456789abcdef 01"} {
		if _, err := Token(weak); err == nil {
			t.Errorf("token %q accepted", weak)
		}
	}
}

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if err := os.WriteFile(path, []byte("\n "+goodToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadTokenFile(path); err != nil || got != goodToken {
		t.Errorf("ReadTokenFile = %q, %v", got, err)
	}
	if _, err := ReadTokenFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file accepted")
	}
	if err := os.WriteFile(path, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTokenFile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a short token: %v, want an error naming the file", err)
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
	a, err := base.WithToken(goodToken)
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
