// Command chartgen regenerates the derived files of charts/limiterd (the CRD and dashboard
// copies, README.md) from the repository; with -check it changes nothing and exits 1 when any
// of them is out of date. hack/helm-docs.sh and `make chart-docs` run it from the repository root.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/limiterd/limiterd/test/helm/chartgen"
)

func main() {
	check := flag.Bool("check", false, "only check that the generated files are current")
	root := flag.String("root", ".", "the repository's root directory")
	flag.Parse()
	if *check {
		if err := chartgen.Check(*root); err != nil {
			fmt.Fprintln(os.Stderr, "chartgen:", err)
			os.Exit(1)
		}
		return
	}
	changed, err := chartgen.Write(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chartgen:", err)
		os.Exit(1)
	}
	for _, p := range changed {
		fmt.Println("wrote", p)
	}
}
