// Package tlsreload serves TLS with a certificate, key and optional client CA read from files,
// and reloads them when they change, without a restart: a Secret mounted in a pod is replaced by
// cert-manager or an operator, and new handshakes use the new files while open connections keep
// theirs.
//
// It wraps kube-apiserver's own machinery (k8s.io/apiserver/pkg/server/dynamiccertificates):
// the files are watched (fsnotify, and re-read every minute in case an event was missed), a
// certificate and key that do not match (one written before the other) or that do not parse are
// not applied, and the last good pair keeps serving until the files are whole again.
package tlsreload

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// Options name the files.
type Options struct {
	// CertFile and KeyFile are the PEM certificate (chain) and private key served. Required.
	CertFile, KeyFile string
	// ClientCAFile, if set, turns on mutual TLS: clients must present a certificate signed by
	// one of its PEM CA certificates, and the handshake fails otherwise.
	ClientCAFile string
}

// Config is a TLS server configuration that follows its files. Create it with New and run it
// with Run.
type Config struct {
	serving *dynamiccertificates.DynamicCertKeyPairContent
	ca      *dynamiccertificates.DynamicFileCAContent // nil without mutual TLS
	ctrl    *dynamiccertificates.DynamicServingCertificateController
}

// New loads the files once; an error means they cannot serve (missing, not PEM, a key that does
// not match the certificate).
func New(opts Options) (*Config, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, errors.New("tls: a certificate file and a key file are both required")
	}
	serving, err := dynamiccertificates.NewDynamicServingContentFromFiles("serving", opts.CertFile, opts.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", opts.CertFile, opts.KeyFile, err)
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"}, // HTTP/2 (gRPC) and HTTP/1.1
	}
	c := &Config{serving: serving}
	var clientCA dynamiccertificates.CAContentProvider
	if opts.ClientCAFile != "" {
		if c.ca, err = dynamiccertificates.NewDynamicCAContentFromFile("client-ca", opts.ClientCAFile); err != nil {
			return nil, fmt.Errorf("tls: load client CA %s: %w", opts.ClientCAFile, err)
		}
		clientCA = c.ca
		base.ClientAuth = tls.RequireAndVerifyClientCert
	}
	c.ctrl = dynamiccertificates.NewDynamicServingCertificateController(base, clientCA, serving, nil, nil)
	serving.AddListener(c.ctrl)
	if c.ca != nil {
		c.ca.AddListener(c.ctrl)
	}
	if err := c.ctrl.RunOnce(); err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return c, nil
}

// ServerConfig returns a configuration for a server (http.Server.TLSConfig, tls.NewListener,
// gRPC's credentials.NewTLS): every handshake takes the files' latest good content.
func (c *Config) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2", "http/1.1"},
		GetConfigForClient: c.ctrl.GetConfigForClient,
	}
}

// Run watches the files until ctx is done. A change that cannot be applied is logged (through
// klog) and retried; the last good content keeps serving.
func (c *Config) Run(ctx context.Context) error {
	go c.serving.Run(ctx, 1)
	if c.ca != nil {
		go c.ca.Run(ctx, 1)
	}
	c.ctrl.Run(1, ctx.Done())
	return nil
}
