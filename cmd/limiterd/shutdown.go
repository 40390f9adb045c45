package main

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// defaultShutdownDelay is how long limiterd keeps serving after SIGTERM by default: long enough
// for the endpoints controller and kube-proxy (or a load balancer's health checks) to stop
// sending it new requests once it reports not ready.
const defaultShutdownDelay = 5 * time.Second

// errShuttingDown is the readiness failure of a replica that is shutting down.
var errShuttingDown = errors.New("shutting down")

// shuttingDown is the readiness check that fails once shutdown has started, ahead of every
// other: the replica leaves its Services while it still serves.
func (d *daemon) shuttingDown(context.Context) error {
	if d.isDraining.Load() {
		return errShuttingDown
	}
	return nil
}

// closeWhenDraining makes a response close its connection once shutdown has started, so that
// keep-alive clients move to another connection (and, once the replica is out of its Services,
// another replica) after an answer, rather than finding the connection closed under their next
// request when the listeners close.
func (d *daemon) closeWhenDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.isDraining.Load() {
			w.Header()["Connection"] = connectionClose
		}
		next.ServeHTTP(w, r)
	})
}

var connectionClose = []string{"close"}

// drain starts the shutdown: readiness fails and gRPC health says NOT_SERVING at once, while
// every API keeps serving for delay, so that clients stop sending new requests before the
// listeners close. A server that fails meanwhile cuts the delay short with its error.
func (d *daemon) drain(delay time.Duration, failed <-chan error) error {
	d.isDraining.Store(true)
	close(d.draining)
	d.log.Info("limiterd draining", "delay", delay.String())
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case err := <-failed:
		d.log.Error("limiterd failed", "error", err)
		return err
	}
}
