// Command kubectl-limiterd is limiterd's kubectl plugin: installed on the PATH as
// kubectl-limiterd, kubectl runs it as `kubectl limiterd`.
//
// Usage:
//
//	kubectl limiterd explain -f policy.yaml [POLICY] KEY [--cost N] [-o json|yaml]
//
// explain reads a policy file (RateLimitPolicy manifests, the format of limiterd's
// --policy-file), and tells which tier a client key gets and why, that tier's limits, and the
// decision the key's first request would get. It decides with limiterd's own engine on a fresh
// in-memory store: nothing is charged anywhere, and no cluster is needed.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	_ "time/tzdata" // the quotas' time zones, whatever the machine has installed

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the plugin with args (without the program's name) and returns its exit code: 0 on
// success, 1 on any error, which it writes to stderr as kubectl does ("error: ...").
func run(args []string, stdout, stderr io.Writer) int {
	return runAt(args, stdout, stderr, time.Now)
}

// runAt is run with the clock the decisions are made at.
func runAt(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	root := newRootCommand(stdout, stderr, now)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "error: %s\n", err)
	var usage usageError
	if errors.As(err, &usage) || isFlagError(err) {
		fmt.Fprintf(stderr, "See '%s --help' for usage.\n", cmd.Root().DisplayName()+commandPath(cmd))
	}
	return 1
}

// commandPath returns the path of cmd below the root, " explain" for explain.
func commandPath(cmd *cobra.Command) string {
	var parts []string
	for c := cmd; c.HasParent(); c = c.Parent() {
		parts = append([]string{c.Name()}, parts...)
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

// usageError is an error in how the command was called: the message is followed by a pointer
// to the command's help.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// isFlagError reports whether err is cobra's about an unknown command (flag errors are
// usageErrors already: see SetFlagErrorFunc).
func isFlagError(err error) bool { return strings.HasPrefix(err.Error(), "unknown command") }

func newRootCommand(stdout, stderr io.Writer, now func() time.Time) *cobra.Command {
	root := &cobra.Command{
		Use:   "kubectl-limiterd",
		Short: "Explain limiterd's rate limiting decisions",
		Long: `Explain limiterd's rate limiting decisions.

 Find more information at: https://github.com/limiterd/limiterd#kubectl-limiterd`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl limiterd"},
		SilenceErrors: true,
		SilenceUsage:  true,
		// The root alone prints its help, as kubectl does.
		Run: func(cmd *cobra.Command, _ []string) { _ = cmd.Help() },
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	root.AddCommand(newExplainCommand(stdout, now))
	return root
}
