// Command pause is the sandbox ("pause") container of the test node (hack/node): it holds a pod's
// namespaces, reaps children it inherits, and exits on SIGINT or SIGTERM. It is built into
// a scratch image by `make node-images`, because this machine has no registry to pull
// registry.k8s.io/pause from.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
