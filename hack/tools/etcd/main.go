// Command etcd is etcd's own server entry point, pinned to the version the test control plane uses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
