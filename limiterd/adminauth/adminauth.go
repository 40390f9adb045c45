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
//     Every identity the TokenReview returns is authorized by a SubjectAccessReview, whatever
//     its groups: membership of PrivilegedGroup grants nothing by itself.
//   - Token: one bearer token read from a file, and read again when the file changes
//     (TokenFile); whoever presents it may do everything. It can be combined with Kubernetes
//     (WithToken) as a break-glass credential. Only the user the token authenticates as is
//     admitted without a review.
//   - Open: no authentication, everyone may do everything. For local development only.
//     OpenLoopback is Open for a loopback-only listener: it also refuses requests whose Host
//     is not a loopback name, so that a web page cannot reach it by DNS rebinding.
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

	"github.com/limiterd/limiterd/limiterd/httphost"
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

// PrivilegedGroup is the group of the static token's user, who may do everything on the admin
// API. Only the user a TokenFile authenticates is admitted for being in it: an identity that
// a TokenReview puts in this group is authorized by SubjectAccessReview like any other.
const PrivilegedGroup = "limiterd:admins"

// MinTokenBytes is the shortest static token accepted.
const MinTokenBytes = 16

// ErrUnauthenticated reports a request without valid credentials.
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrHostNotLoopback is wrapped by the error of OpenLoopback's Authenticate for a request whose
// Host is not a loopback name: a browser sent it to a name that resolved to loopback (DNS
// rebinding), or a proxy forwarded it. Its text can be shown to the caller.
var ErrHostNotLoopback = errors.New("the admin API without authentication answers only requests to localhost, " +
	"127.0.0.1 or [::1] (any port)")

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
	return &Auth{authn: tf.authenticator(), authz: tf.authorizer(), mode: "token"}
}

// WithToken returns an Auth that also admits the bearer token of tf, as TokenUser, to
// everything; other requests are authenticated and authorized by a, whatever their user's
// name and groups.
func (a *Auth) WithToken(tf *TokenFile) (*Auth, error) {
	authz, err := unionauthz.New(
		unionauthz.NamedAuthorizer{AuthorizerName: "token", Authorizer: tf.authorizer()},
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
// refused. A file that is deleted, emptied, unreadable or holds no valid token revokes the
// token: every token is refused (and the reason logged) until the file holds a valid token
// again. It is safe for concurrent use.
type TokenFile struct {
	path string
	log  *slog.Logger
	now  func() time.Time
	// user is who the token authenticates as: TokenUser in PrivilegedGroup. Its authorizer
	// admits this very value only, not another user of that name or group.
	user *user.DefaultInfo

	mu      sync.Mutex
	checked time.Time         // when the file was last read
	sum     [sha256.Size]byte // of the token in force, when valid
	valid   bool              // whether a token is in force: false once the file lost it
	refused string            // why the file's content was last refused, logged once
}

// LoadTokenFile reads the token in path. It fails if the file cannot be read or does not hold a
// valid token.
func LoadTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	token, err := readToken(path)
	if err != nil {
		return nil, err
	}
	return &TokenFile{
		path: path, log: log, now: time.Now,
		user:    &user.DefaultInfo{Name: TokenUser, Groups: []string{PrivilegedGroup, user.AllAuthenticated}},
		checked: time.Now(), sum: sha256.Sum256([]byte(token)), valid: true,
	}, nil
}

// current returns the digest of the token in force, reading the file again if it is due; ok is
// false while no token is in force (the file was deleted, emptied, or holds no valid token).
// The admin API is not a hot path: one lock a request serialises the reads.
func (tf *TokenFile) current() (sum [sha256.Size]byte, ok bool) {
	tf.mu.Lock()
	defer tf.mu.Unlock()
	now := tf.now()
	if now.Sub(tf.checked) < TokenRecheck {
		return tf.sum, tf.valid
	}
	tf.checked = now
	token, err := readToken(tf.path)
	if err != nil {
		if msg := err.Error(); msg != tf.refused {
			tf.refused = msg
			tf.log.Error("admin token file holds no valid token: every token is refused", "path", tf.path, "error", err)
		}
		tf.valid, tf.sum = false, [sha256.Size]byte{}
		return tf.sum, false
	}
	tf.refused = ""
	if sum := sha256.Sum256([]byte(token)); sum != tf.sum || !tf.valid {
		tf.sum, tf.valid = sum, true
		tf.log.Info("admin token reloaded", "path", tf.path)
	}
	return tf.sum, true
}

// authenticator authenticates requests bearing the token in force, comparing in constant time.
func (tf *TokenFile) authenticator() authenticator.Request {
	return bearertoken.New(authenticator.TokenFunc(func(_ context.Context, got string) (*authenticator.Response, bool, error) {
		sum := sha256.Sum256([]byte(got))
		want, ok := tf.current()
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
			return nil, false, nil
		}
		return &authenticator.Response{User: tf.user}, true, nil
	}))
}

// authorizer admits everything for the user the token authenticated, and has no opinion on
// anyone else: a user of another authenticator (a TokenReview's) is not admitted for its name
// or for being in PrivilegedGroup.
func (tf *TokenFile) authorizer() authorizer.Authorizer {
	privileged := authorizerfactory.NewPrivilegedGroups(PrivilegedGroup)
	return authorizer.AuthorizerFunc(func(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
		if u, ok := attrs.GetUser().(*user.DefaultInfo); !ok || u != tf.user {
			return authorizer.DecisionNoOpinion, "", nil
		}
		return privileged.Authorize(ctx, attrs)
	})
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
	return open(false)
}

// OpenLoopback returns an Auth that lets everyone do everything, as user system:anonymous, for
// a listener on loopback only: a request whose Host (RFC 9110's authority) is not localhost,
// 127.0.0.1, another loopback address or [::1], with any port, is refused with an error
// wrapping ErrHostNotLoopback. A web page can make a browser send requests to a name of its
// own that resolves to 127.0.0.1 (DNS rebinding), but such a request names that name.
func OpenLoopback() *Auth {
	return open(true)
}

func open(loopbackOnly bool) *Auth {
	anonymous := &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}
	mode := "open"
	if loopbackOnly {
		mode = "open-loopback"
	}
	return &Auth{
		authn: authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
			if loopbackOnly && !IsLoopbackHost(r.Host) {
				return nil, false, fmt.Errorf("%w, not to %q", ErrHostNotLoopback, r.Host)
			}
			return &authenticator.Response{User: anonymous}, true, nil
		}),
		authz: authorizerfactory.NewAlwaysAllowAuthorizer(),
		mode:  mode,
	}
}

// IsLoopbackHost reports whether hostport, a request's Host ("host" or "host:port"), names
// loopback: localhost (in any case, with or without a trailing dot), or a loopback IP address
// without a zone (IPv6 in brackets). A Host httphost.Parse refuses names nothing.
func IsLoopbackHost(hostport string) bool {
	name, ip, ok := httphost.Parse(hostport)
	if !ok {
		return false
	}
	if ip.IsValid() {
		return ip.Zone() == "" && ip.IsLoopback()
	}
	return strings.EqualFold(name, "localhost")
}
