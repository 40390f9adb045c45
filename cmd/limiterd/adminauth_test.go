package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
)

func TestAdminFlags(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for args, want := range map[string]string{
		"--policy-file a":                                             "127.0.0.1:9090",
		"--policy-file a --admin-addr [::1]:9":                        "[::1]:9",
		"--policy-file a --admin-addr localhost:9":                    "localhost:9",
		"--policy-file a --admin-token-file " + token:                 ":9090",
		"--policy-file a --admin-insecure-no-auth":                    ":9090",
		"--policy-file a --admin-addr :9 --admin-token-file " + token: ":9",
		"--kubeconfig kc":                                             ":9090",
	} {
		cfg, err := parseFlags(strings.Fields(args), io.Discard)
		if err != nil || cfg.adminAddr != want {
			t.Errorf("%s: admin address %q, %v; want %q", args, cfg.adminAddr, err, want)
		}
	}
	for args, want := range map[string]string{
		"--policy-file a --admin-addr :9090":                                   "not a loopback address",
		"--policy-file a --admin-addr 10.0.0.1:9090":                           "not a loopback address",
		"--policy-file a --admin-insecure-no-auth --admin-token-file " + token: "contradict",
	} {
		if _, err := parseFlags(strings.Fields(args), io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", args, err, want)
		}
	}
}

func TestAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	token := "0123456789abcdef0123"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, hooks{}, "--policy-file", policyFile(t, dir, tokenBucketPolicy), "--admin-token-file", tokenFile)
	for _, bearer := range []string{"", "wrong-token-of-enough-length"} {
		if status, body := adminCall(t, http.MethodDelete, d.admin+"/v1/clients?key=alice", bearer); status != 401 || !isJSONError(body) {
			t.Errorf("reset with token %q: %d %s, want 401 with a JSON error", bearer, status, body)
		}
	}
	if status, body := adminCall(t, http.MethodDelete, d.admin+"/v1/clients?key=alice", token); status != 204 {
		t.Errorf("reset with the token: %d %s, want 204", status, body)
	}
	if status, _ := adminCall(t, http.MethodGet, d.admin+"/metrics", token); status != 200 {
		t.Errorf("/metrics with the token: %d, want 200", status)
	}
	if status, _ := adminCall(t, http.MethodGet, d.admin+"/readyz", ""); status != 200 {
		t.Errorf("/readyz without a token: %d, want 200", status)
	}

	// A rotated token takes effect without a restart, and the old one stops working.
	rotated := "fedcba9876543210-rotated"
	if err := os.WriteFile(tokenFile, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "the rotated token to be accepted", func() bool {
		status, _ := adminCall(t, http.MethodDelete, d.admin+"/v1/clients?key=alice", rotated)
		return status == 204
	})
	if status, _ := adminCall(t, http.MethodDelete, d.admin+"/v1/clients?key=alice", token); status != 401 {
		t.Errorf("reset with the old token after the rotation: %d, want 401", status)
	}

	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseFlags([]string{"--policy-file", policyFile(t, dir, tokenBucketPolicy), "--admin-token-file", short}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := serve(t.Context(), cfg, io.Discard, hooks{}); err == nil || !strings.Contains(err.Error(), "at least 16 bytes") {
		t.Errorf("a short token: %v, want refused", err)
	}
}

// TestAdminLoopbackHost: without authentication on loopback, the admin API answers only
// requests that name a loopback Host, so that a web page cannot reach it through a name of its
// own resolving to 127.0.0.1 (DNS rebinding); health stays open. Before, any Host was served.
func TestAdminLoopbackHost(t *testing.T) {
	d := start(t, hooks{}, "--policy-file", policyFile(t, t.TempDir(), tokenBucketPolicy))
	call := func(method, path, host string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, d.admin+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	port := d.admin[strings.LastIndex(d.admin, ":"):]
	for _, host := range []string{"attacker.example" + port, "attacker.example", "127.0.0.1.nip.io" + port} {
		for _, c := range []struct{ method, path string }{{http.MethodDelete, "/v1/clients?key=alice"}, {http.MethodGet, "/v1/policies"}, {http.MethodGet, "/metrics"}} {
			if status, body := call(c.method, c.path, host); status != http.StatusForbidden || !isJSONError(body) || !strings.Contains(body, "localhost") {
				t.Errorf("%s %s with Host %q: %d %s, want 403 with a JSON error naming the loopback hosts", c.method, c.path, host, status, body)
			}
		}
		if status, body := call(http.MethodGet, "/healthz", host); status != http.StatusOK {
			t.Errorf("/healthz with Host %q: %d %s, want 200", host, status, body)
		}
	}
	for _, host := range []string{"localhost" + port, "127.0.0.1" + port, "localhost"} {
		if status, body := call(http.MethodDelete, "/v1/clients?key=alice", host); status != http.StatusNoContent {
			t.Errorf("reset with Host %q: %d %s, want 204", host, status, body)
		}
	}
}

func TestAdminInsecureNoAuthWarns(t *testing.T) {
	d := start(t, hooks{}, "--policy-file", policyFile(t, t.TempDir(), tokenBucketPolicy), "--admin-insecure-no-auth")
	if status, _ := adminCall(t, http.MethodDelete, d.admin+"/v1/clients?key=alice", ""); status != 204 {
		t.Errorf("reset without auth: %d, want 204", status)
	}
	if !strings.Contains(d.logs.String(), `"level":"WARN","msg":"admin API authentication is off`) {
		t.Errorf("no warning logged:\n%s", d.logs)
	}
}

// TestAdminKubernetesAuth runs limiterd against a real API server: bearer tokens of service
// accounts are reviewed with TokenReview, and client resets authorized by RBAC on
// ratelimitpolicies/clients in the policy's namespace.
func TestAdminKubernetesAuth(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := t.Context()
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	nsA, nsB := env.Namespace(t), env.Namespace(t)
	// The chart's ClusterRole, bound in namespace A only.
	mustCreate(t, func() error {
		_, err := clientset.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "limiterd-client-admin"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{adminauth.Group}, Resources: []string{"ratelimitpolicies/clients"}, Verbs: []string{"get", "delete"}},
				{APIGroups: []string{adminauth.Group}, Resources: []string{"ratelimitpolicies"}, Verbs: []string{"get", "list", "watch"}},
			},
		}, metav1.CreateOptions{})
		return err
	})
	tenant := serviceAccountToken(t, clientset, nsA, "tenant")
	stranger := serviceAccountToken(t, clientset, nsA, "stranger")
	mustCreate(t, func() error {
		_, err := clientset.RbacV1().RoleBindings(nsA).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant-client-admin"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "limiterd-client-admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tenant", Namespace: nsA}},
		}, metav1.CreateOptions{})
		return err
	})

	policies := namespacedPolicy(nsA) + "---\n" + namespacedPolicy(nsB)
	empty := env.Namespace(t) // no policy ConfigMaps: policies come from the file
	d := start(t, hooks{}, "--policy-file", policyFile(t, t.TempDir(), policies),
		"--kubeconfig", env.KubeconfigPath(), "--namespace", empty, "--status-interval", "0")
	testsupport.Eventually(t, 30*time.Second, "limiterd ready", func() error {
		if status, body := adminCall(t, http.MethodGet, d.admin+"/readyz", ""); status != 200 {
			return fmt.Errorf("/readyz: %d %s", status, body)
		}
		return nil
	})
	exhaust := func(ns string) {
		t.Helper()
		for range 3 {
			allowKey(t, d.decisions, ns+"/api", "alice")
		}
		if status := allowKey(t, d.decisions, ns+"/api", "alice"); status != 429 {
			t.Fatalf("%s/api: %d after the capacity, want 429", ns, status)
		}
	}
	exhaust(nsA)
	exhaust(nsB)
	reset := func(ns string) string { return d.admin + "/v1/clients?policy=" + ns + "/api&key=alice" }

	cases := []struct {
		name, method, url, token string
		status                   int
	}{
		{"no token", http.MethodDelete, reset(nsA), "", 401},
		{"a malformed token", http.MethodDelete, reset(nsA), "not-a-token", 401},
		{"a token of another signer", http.MethodDelete, reset(nsA), forgeToken(t, tenant, nil, 0), 401},
		{"an expired token", http.MethodDelete, reset(nsA), forgeToken(t, tenant, signingKey(t, env), -2*time.Hour), 401},
		{"no right", http.MethodDelete, reset(nsA), stranger, 403},
		{"no right to read", http.MethodGet, reset(nsA), stranger, 403},
		{"the right in the other namespace", http.MethodDelete, reset(nsB), tenant, 403},
		{"the right in the other namespace, read", http.MethodGet, reset(nsB), tenant, 403},
		{"metrics without the right", http.MethodGet, d.admin + "/metrics", tenant, 403},
		{"metrics without a token", http.MethodGet, d.admin + "/metrics", "", 401},
		{"the right", http.MethodDelete, reset(nsA), tenant, 204},
		{"the right to read", http.MethodGet, reset(nsA), tenant, 200},
		{"a re-signed valid token", http.MethodGet, reset(nsA), forgeToken(t, tenant, signingKey(t, env), 0), 200},
		{"health without a token", http.MethodGet, d.admin + "/healthz", "", 200},
	}
	for _, tc := range cases {
		status, body := adminCall(t, tc.method, tc.url, tc.token)
		if status != tc.status {
			t.Errorf("%s: %s %s: %d %s, want %d", tc.name, tc.method, tc.url, status, body, tc.status)
		}
		if status >= 400 && !isJSONError(body) {
			t.Errorf("%s: body %q is not a JSON error", tc.name, body)
		}
	}
	if status := allowKey(t, d.decisions, nsA+"/api", "alice"); status != 200 {
		t.Errorf("%s/api after the reset: %d, want 200", nsA, status)
	}
	if status := allowKey(t, d.decisions, nsB+"/api", "alice"); status != 429 {
		t.Errorf("%s/api after the refused reset: %d, want 429 (not reset)", nsB, status)
	}

	// The listing shows what the caller may list.
	status, body := adminCall(t, http.MethodGet, d.admin+"/v1/policies", tenant)
	if status != 200 || !strings.Contains(body, `"id":"`+nsA+`/api"`) || strings.Contains(body, nsB) {
		t.Errorf("tenant's /v1/policies: %d %s, want %s/api only", status, body, nsA)
	}
	status, body = adminCall(t, http.MethodGet, d.admin+"/v1/policies", stranger)
	if status != 200 || strings.Contains(body, "/api") {
		t.Errorf("stranger's /v1/policies: %d %s, want none", status, body)
	}
	// An administrator (cluster-admin by group) may scrape metrics.
	admin := serviceAccountToken(t, clientset, nsB, "prometheus")
	mustCreate(t, func() error {
		_, err := clientset.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-reader-"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:monitoring"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: nsB}},
		}, metav1.CreateOptions{})
		return err
	})
	if status, body := adminCall(t, http.MethodGet, d.admin+"/metrics", admin); status != 200 || !strings.Contains(body, "limiterd_") {
		t.Errorf("/metrics with system:monitoring: %d, want 200 with metrics", status)
	}
}

func namespacedPolicy(namespace string) string {
	return strings.Replace(tokenBucketPolicy, "  name: api\n", "  name: api\n  namespace: "+namespace+"\n", 1)
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

// serviceAccountToken creates a service account and returns a token of it from TokenRequest.
func serviceAccountToken(t *testing.T, c kubernetes.Interface, namespace, name string) string {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// signingKey returns the API server's service account signing key.
func signingKey(t *testing.T, env *testenv.Env) *ecdsa.PrivateKey {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.Environment.ControlPlane.APIServer.CertDir, "sa-signer.key"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatal("sa-signer.key: no PEM block")
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatalf("sa-signer.key: %v", err)
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("sa-signer.key is a %T, want ECDSA", k)
	}
	return ec
}

// forgeToken re-signs token's claims, its times shifted by shift, with key (nil: a key of its
// own), as ES256: shifted into the past it is a genuine but expired token.
func forgeToken(t *testing.T, token string, key *ecdsa.PrivateKey, shift time.Duration) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d parts", len(parts))
	}
	header, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	if err := json.Unmarshal(header, &h); err != nil || h["alg"] != "ES256" {
		t.Fatalf("token header %s: %v, want ES256", header, err)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"exp", "iat", "nbf"} {
		if v, ok := claims[c].(float64); ok {
			claims[c] = int64(v) + int64(shift/time.Second)
		}
	}
	if payload, err = json.Marshal(claims); err != nil {
		t.Fatal(err)
	}
	if key == nil {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	digest := sha256.Sum256([]byte(signed))
	r, s, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func adminCall(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func allowKey(t *testing.T, decisions, policy, key string) int {
	t.Helper()
	status, _ := adminCall(t, http.MethodGet, decisions+"/v1/allow?policy="+policy+"&key="+key, "")
	return status
}

func isJSONError(body string) bool {
	var e struct {
		Error string `json:"error"`
	}
	return json.Unmarshal([]byte(body), &e) == nil && e.Error != ""
}
