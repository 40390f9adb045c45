package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/limiterd/limiterd/limiterd/tlsreload"
)

// tlsFlags is what the TLS flags say.
type tlsFlags struct {
	certFile, keyFile, clientCAFile string
}

// register adds the TLS flags to fs.
func (c *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.certFile, "tls-cert-file", "",
		"`path` of a PEM certificate (chain): serve the decisions API, gRPC and the admin API over TLS; reloaded when it changes")
	fs.StringVar(&c.keyFile, "tls-key-file", "", "`path` of the PEM private key of --tls-cert-file; reloaded when it changes")
	fs.StringVar(&c.clientCAFile, "tls-client-ca-file", "",
		"`path` of PEM CA certificates: the decisions API and gRPC require client certificates they signed (mutual TLS; "+
			"the admin API authenticates bearer tokens instead); reloaded when it changes")
}

// check validates the TLS flags after parsing.
func (c *tlsFlags) check() error {
	switch {
	case (c.certFile == "") != (c.keyFile == ""):
		return errors.New("--tls-cert-file and --tls-key-file go together")
	case c.clientCAFile != "" && c.certFile == "":
		return errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
	}
	return nil
}

// serverTLS is the TLS of limiterd's servers; nil fields serve plaintext.
type serverTLS struct {
	decisions *tls.Config // decisions HTTP and gRPC, with the client CA if any
	admin     *tls.Config // admin HTTP, without client certificates
}

// addTLS loads the TLS files, if the flags name them, and adds their watchers to d's background
// loops.
func (d *daemon) addTLS(c tlsFlags) error {
	if c.certFile == "" {
		return nil
	}
	decisions, err := tlsreload.New(tlsreload.Options{CertFile: c.certFile, KeyFile: c.keyFile, ClientCAFile: c.clientCAFile})
	if err != nil {
		return err
	}
	admin := decisions
	if c.clientCAFile != "" {
		if admin, err = tlsreload.New(tlsreload.Options{CertFile: c.certFile, KeyFile: c.keyFile}); err != nil {
			return err
		}
		d.background = append(d.background, admin.Run)
	}
	d.background = append(d.background, decisions.Run)
	d.tls = serverTLS{decisions: decisions.ServerConfig(), admin: admin.ServerConfig()}
	d.log.Info("tls", "cert_file", c.certFile, "key_file", c.keyFile, "client_ca_file", c.clientCAFile)
	return nil
}

// listen listens on addr, bounded by limit, over TLS with cfg unless it is nil. The bound
// wraps the TCP listener, under TLS: an http.Server serves HTTP/2 and sets Request.TLS only for
// the *tls.Conn its listener accepts, so a TLS listener must be the outermost.
func listen(ctx context.Context, addr string, limit func(net.Listener) net.Listener, cfg *tls.Config) (net.Listener, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err //nolint:wrapcheck // the callers say which listener
	}
	ln = limit(ln)
	if cfg == nil {
		return ln, nil
	}
	return tls.NewListener(ln, cfg), nil
}

// grpcCredentials returns the gRPC server's transport credentials (nil: plaintext).
func (t serverTLS) grpcCredentials() credentials.TransportCredentials {
	if t.decisions == nil {
		return nil
	}
	return credentials.NewTLS(t.decisions)
}
