// Package adminauth decides who may call limiterd's admin API: it authenticates a request's
// bearer token and authorizes what the request asks to do, the way Kubernetes API servers and
// kube-rbac-proxy do.
//
// Three modes, each an Auth:
//
//   - Kubernetes: the token is reviewed with a TokenReview and each action with a
//     SubjectAccessReview on the API server limiterd reads its policies from, through
//     k8s.io/apiserver's delegating authenticator and authorizer, which cache the answers
//     briefly (KubernetesOptions). The actions are those of the attribute functions below:
//     resetting a client of policy shop/api is "delete ratelimitpolicies/clients shop/api"
//     in group limiterd.dev, so an ordinary Role grants it for one namespace.
//   - Token: one bearer token read from a file, and read again when the file changes
//     (TokenFile); whoever presents it may do everything. It can be combined with Kubernetes
//     (WithToken) as a break-glass credential.
//   - Open: no authentication, everyone may do everything. For a loopback-only listener or
//     local development only.
package adminauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	unionauthn "k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	unionauthz "k8s.io/apiserver/pkg/authorization/union"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The resources the admin API authorizes against, in API group Group.
const (
	// Group is the API group of RateLimitPolicy.
	Group = "limiterd.dev"
	// Resource is RateLimitPolicy's resource.
	Resource = "ratelimitpolicies"
	// ClientsSubresource is the virtual subresource holding a policy's client state: "get" reads a
	// client's state, "delete" resets it. The API server does not serve it; RBAC rules name it
	// as "ratelimitpolicies/clients".
	ClientsSubresource = "clients"
)

// TokenUser is the user a valid --admin-token-file token authenticates as; it is in
// PrivilegedGroup.
const TokenUser = "limiterd:admin-token"

// PrivilegedGroup is the group whose members may do everything on the admin API.
const PrivilegedGroup = "limiterd:admins"

// MinTokenBytes is the shortest static token accepted.
const MinTokenBytes = 16

// ErrUnauthenticated reports a request without valid credentials.
var ErrUnauthenticated = errors.New("unauthenticated")

// Auth authenticates and authorizes admin API requests. Create it with Kubernetes, Token or
// Open. It is safe for concurrent use.
type Auth struct {
	authn authenticator.Request
	authz authorizer.Authorizer
	mode  string
}

// Mode names the mode for logs: "kubernetes", "token", "kubernetes+token" or "open".
func (a *Auth) Mode() string { return a.mode }

// Authenticate returns who sent r. A request without credentials, or with credentials that are
// not valid (unknown, expired, revoked, or not reviewable because the API server cannot be
// reached), returns an error wrapping ErrUnauthenticated, as kube-apiserver answers 401 in
// each case.
func (a *Auth) Authenticate(r *http.Request) (user.Info, error) {
	res, ok, err := a.authn.AuthenticateRequest(r)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	case !ok || res == nil || res.User == nil:
		return nil, fmt.Errorf("%w: no bearer token", ErrUnauthenticated)
	}
	return res.User, nil
}

// Authorize reports whether attrs' user may take attrs' action. reason explains a denial when
// the authorizer gives one. err is set when no decision could be had (the SubjectAccessReview
// failed); allowed is then false.
func (a *Auth) Authorize(ctx context.Context, attrs authorizer.Attributes) (allowed bool, reason string, err error) {
	d, reason, err := a.authz.Authorize(ctx, attrs)
	if err != nil {
		return false, reason, fmt.Errorf("authorize %s: %w", describe(attrs), err)
	}
	return d == authorizer.DecisionAllow, reason, nil
}

func describe(a authorizer.Attributes) string {
	if !a.IsResourceRequest() {
		return a.GetVerb() + " " + a.GetPath()
	}
	res := a.GetResource()
	if a.GetSubresource() != "" {
		res += "/" + a.GetSubresource()
	}
	return a.GetVerb() + " " + res + " " + a.GetNamespace() + "/" + a.GetName()
}

// PolicyClients is the action of reading ("get") or resetting ("delete") the client state of
// policy namespace/name.
func PolicyClients(u user.Info, verb, namespace, name string) authorizer.AttributesRecord {
	return authorizer.AttributesRecord{
		User: u, Verb: verb, Namespace: namespace, Name: name,
		APIGroup: Group, Resource: Resource, Subresource: ClientsSubresource, ResourceRequest: true,
	}
}

// ListPolicies is the action of listing the policies of a namespace.
func ListPolicies(u user.Info, namespace string) authorizer.AttributesRecord {
	return authorizer.AttributesRecord{
		User: u, Verb: "list", Namespace: namespace, APIGroup: Group, Resource: Resource, ResourceRequest: true,
	}
}

// Path is the action of calling a path that is no resource, such as "get" /metrics (the
// nonResourceURLs of an RBAC rule).
func Path(u user.Info, verb, path string) authorizer.AttributesRecord {
	return authorizer.AttributesRecord{User: u, Verb: verb, Path: path}
}

// KubernetesOptions configure Kubernetes. Zero values take the defaults.
type KubernetesOptions struct {
	// TokenCacheTTL is how long a TokenReview's answer is kept (default 1m).
	TokenCacheTTL time.Duration
	// AllowCacheTTL and DenyCacheTTL are how long a SubjectAccessReview's answer is kept
	// (defaults 1m and 10s): a revoked RoleBinding stops working within AllowCacheTTL, a new one
	// within DenyCacheTTL.
	AllowCacheTTL, DenyCacheTTL time.Duration
	// Timeout bounds one review call (default 10s).
	Timeout time.Duration
}

// Default cache durations of Kubernetes.
const (
	DefaultTokenCacheTTL = time.Minute
	DefaultAllowCacheTTL = time.Minute
	DefaultDenyCacheTTL  = 10 * time.Second
	DefaultReviewTimeout = 10 * time.Second
)

// webhookBackoff is kube-apiserver's DefaultAuthWebhookRetryBackoff: at most 5 tries over
// about 4 seconds when the API server answers with a retryable error.
func webhookBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// Kubernetes returns an Auth that reviews tokens and actions with the API server of cfg.
// limiterd's identity there needs to create tokenreviews and subjectaccessreviews (ClusterRole
// system:auth-delegator).
func Kubernetes(cfg *rest.Config, opts KubernetesOptions) (*Auth, error) {
	if opts.TokenCacheTTL <= 0 {
		opts.TokenCacheTTL = DefaultTokenCacheTTL
	}
	if opts.AllowCacheTTL <= 0 {
		opts.AllowCacheTTL = DefaultAllowCacheTTL
	}
	if opts.DenyCacheTTL <= 0 {
		opts.DenyCacheTTL = DefaultDenyCacheTTL
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultReviewTimeout
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for admin authentication: %w", err)
	}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
		TokenAccessReviewClient:  client.AuthenticationV1(),
		TokenAccessReviewTimeout: opts.Timeout,
		WebhookRetryBackoff:      webhookBackoff(),
		CacheTTL:                 opts.TokenCacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("admin authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             opts.AllowCacheTTL,
		DenyCacheTTL:              opts.DenyCacheTTL,
		WebhookRetryBackoff:       webhookBackoff(),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("admin authorizer: %w", err)
	}
	return &Auth{authn: authn, authz: authz, mode: "kubernetes"}, nil
}

// Token returns an Auth that admits the bearer token of tf, as TokenUser, to everything.
func Token(tf *TokenFile) *Auth {
	return &Auth{authn: tf.authenticator(), authz: authorizerfactory.NewPrivilegedGroups(PrivilegedGroup), mode: "token"}
}

// WithToken returns an Auth that also admits the bearer token of tf, as TokenUser, to
// everything; other requests are authenticated and authorized by a.
func (a *Auth) WithToken(tf *TokenFile) (*Auth, error) {
	authz, err := unionauthz.New(
		unionauthz.NamedAuthorizer{AuthorizerName: "token", Authorizer: authorizerfactory.NewPrivilegedGroups(PrivilegedGroup)},
		unionauthz.NamedAuthorizer{AuthorizerName: a.mode, Authorizer: a.authz})
	if err != nil {
		return nil, fmt.Errorf("admin authorizer: %w", err)
	}
	return &Auth{authn: unionauthn.New(tf.authenticator(), a.authn), authz: authz, mode: a.mode + "+token"}, nil
}

// TokenRecheck is how long a TokenFile trusts what it read before it reads its file again.
const TokenRecheck = time.Second

// TokenFile is a static bearer token kept in a file: the file's content without surrounding
// white space, at least MinTokenBytes long, with no white space inside. The file is read again
// when a request comes TokenRecheck or more after the last read, so that a rotated token (a
// Secret updated in place, a file rewritten) is honoured without a restart, and the old one is
// refused. Content that is not a valid token (a file being written, a mistake) is not applied:
// it is logged, and the last good token stays in force. It is safe for concurrent use.
type TokenFile struct {
	path string
	log  *slog.Logger
	now  func() time.Time

	mu      sync.Mutex
	checked time.Time         // when the file was last read
	sum     [sha256.Size]byte // of the token in force
	refused string            // why the file's content was last refused, logged once
}

// LoadTokenFile reads the token in path. It fails if the file cannot be read or does not hold a
// valid token.
func LoadTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	token, err := readToken(path)
	if err != nil {
		return nil, err
	}
	return &TokenFile{path: path, log: log, now: time.Now, checked: time.Now(), sum: sha256.Sum256([]byte(token))}, nil
}

// current returns the digest of the token in force, reading the file again if it is due. The
// admin API is not a hot path: one lock a request serialises the reads.
func (tf *TokenFile) current() [sha256.Size]byte {
	tf.mu.Lock()
	defer tf.mu.Unlock()
	now := tf.now()
	if now.Sub(tf.checked) < TokenRecheck {
		return tf.sum
	}
	tf.checked = now
	token, err := readToken(tf.path)
	if err != nil {
		if msg := err.Error(); msg != tf.refused {
			tf.refused = msg
			tf.log.Error("admin token file not applied: the last good token stays in force", "path", tf.path, "error", err)
		}
		return tf.sum
	}
	tf.refused = ""
	if sum := sha256.Sum256([]byte(token)); sum != tf.sum {
		tf.sum = sum
		tf.log.Info("admin token reloaded", "path", tf.path)
	}
	return tf.sum
}

// authenticator authenticates requests bearing the token in force, comparing in constant time.
func (tf *TokenFile) authenticator() authenticator.Request {
	tokenUser := &user.DefaultInfo{Name: TokenUser, Groups: []string{PrivilegedGroup, user.AllAuthenticated}}
	return bearertoken.New(authenticator.TokenFunc(func(_ context.Context, got string) (*authenticator.Response, bool, error) {
		sum := sha256.Sum256([]byte(got))
		want := tf.current()
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			return nil, false, nil
		}
		return &authenticator.Response{User: tokenUser}, true, nil
	}))
}

// readToken reads a static token from path.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read admin token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if err := checkToken(token); err != nil {
		return "", fmt.Errorf("admin token %s: %w", path, err)
	}
	return token, nil
}

func checkToken(token string) error {
	switch {
	case len(token) < MinTokenBytes:
		return fmt.Errorf("a token must be at least %d bytes long", MinTokenBytes)
	case strings.ContainsAny(token, " \t\r\n"):
		return errors.New("a token must not contain white space")
	}
	return nil
}

// New returns an Auth of an authenticator and an authorizer, for another way of deciding (a
// test's, say). mode names it in logs.
func New(authn authenticator.Request, authz authorizer.Authorizer, mode string) *Auth {
	return &Auth{authn: authn, authz: authz, mode: mode}
}

// Open returns an Auth that lets everyone do everything, as user system:anonymous.
func Open() *Auth {
	anonymous := &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}
	return &Auth{
		authn: authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
			return &authenticator.Response{User: anonymous}, true, nil
		}),
		authz: authorizerfactory.NewAlwaysAllowAuthorizer(),
		mode:  "open",
	}
}
