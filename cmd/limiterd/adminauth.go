package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/limiterd/limiterd/limiterd/adminauth"
)

// Default admin addresses: every interface when callers are authenticated, loopback only when
// they are not.
const (
	defaultAdminAddr         = ":9090"
	defaultLoopbackAdminAddr = "127.0.0.1:9090"
)

// adminAuthConfig is what the admin authentication flags say.
type adminAuthConfig struct {
	tokenFile string
	insecure  bool

	loopbackOnly bool // no credentials are checked: the admin API must listen on loopback only
}

// register adds the admin authentication flags to fs.
func (c *adminAuthConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.tokenFile, "admin-token-file", "",
		"`path` of a file holding a bearer token (at least 16 bytes) that may do everything on the admin API; "+
			"with Kubernetes it is accepted besides the TokenReview of other tokens; the file is read again when it changes, "+
			"so a rotated token works without a restart")
	fs.BoolVar(&c.insecure, "admin-insecure-no-auth", false,
		"serve the admin API (client resets, policies, metrics) to anyone without authentication: for local development only")
}

// check resolves the admin address and authentication after parsing: with Kubernetes, callers
// are authenticated by TokenReview; with policy files only and no token file, the admin API
// listens on loopback only, and refuses another address, unless --admin-insecure-no-auth.
func (c *adminAuthConfig) check(adminAddr *string, kube bool) error {
	if c.insecure && c.tokenFile != "" {
		return errors.New("--admin-insecure-no-auth and --admin-token-file contradict each other")
	}
	c.loopbackOnly = !kube && c.tokenFile == "" && !c.insecure
	switch {
	case *adminAddr == "" && c.loopbackOnly:
		*adminAddr = defaultLoopbackAdminAddr
	case *adminAddr == "":
		*adminAddr = defaultAdminAddr
	case c.loopbackOnly && !isLoopback(*adminAddr):
		return fmt.Errorf("--admin-addr %s is not a loopback address, and the admin API (which resets clients) "+
			"would be open to anyone: give --admin-token-file, or --admin-insecure-no-auth for local development", *adminAddr)
	}
	return nil
}

// isLoopback reports whether addr ("host:port") listens on loopback only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// build returns the admin API's Auth: Kubernetes reviews (plus the token file) when limiterd
// talks to an API server, the token file alone, or no authentication (loopback only, which also
// refuses requests naming another Host, against DNS rebinding; or --admin-insecure-no-auth,
// which is logged as a warning).
func (c adminAuthConfig) build(kube kubeConfig, log *slog.Logger) (*adminauth.Auth, error) {
	if c.insecure {
		log.Warn("admin API authentication is off: anyone who reaches the admin address may reset clients and read policies and metrics",
			"flag", "--admin-insecure-no-auth")
		return adminauth.Open(), nil
	}
	var token *adminauth.TokenFile
	if c.tokenFile != "" {
		var err error
		if token, err = adminauth.LoadTokenFile(c.tokenFile, log); err != nil {
			return nil, err
		}
	}
	switch {
	case kube.enabled:
		cfg, err := kube.restConfig()
		if err != nil {
			return nil, err
		}
		auth, err := adminauth.Kubernetes(cfg, adminauth.KubernetesOptions{})
		if err != nil {
			return nil, err
		}
		if token != nil {
			return auth.WithToken(token)
		}
		return auth, nil
	case token != nil:
		return adminauth.Token(token), nil
	}
	log.Info("admin API without authentication on loopback only, for requests to a loopback Host: " +
		"give --admin-token-file to serve it on other addresses")
	return adminauth.OpenLoopback(), nil
}
