package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// The addresses the README's quick start calls: `make run`'s decisions (RUN_ADDR) and limiterd's
// admin API with policy files only.
const (
	quickStartDecisions = "localhost:8080"
	quickStartAdmin     = "localhost:9090"
)

// quickStartCommand is a command of the README's quick start and the answer the README shows
// for it: the comment lines right after it, up to a blank line or the next command.
type quickStartCommand struct {
	line   int // of README.md
	shell  string
	answer []string // without "# "
}

// TestReadmeQuickStart runs the README's quick start as a reader does: bin/limiterd started as
// `make run` starts it (the Makefile's recipe), then every command of the quick start's second
// block, as written but for the ports, through bash in one go, and checks each against the answer
// the README shows after it: the status line, each header shown, and the body (every field; "..."
// elides). For a command without -i the lines shown are its output, blanks aside. A command that
// shows no answer must succeed and answer no JSON error. Only a rejection's resetAfterMs and
// retryAfterMs may differ from the README's, by less than 200 ms: they count down from the charge
// of the command before (the batch), by the time between the two, which the README cannot know;
// 200 ms is one token of the sample's free tier, so a longer time would change "remaining" too.
// The allowed answers of the quick start are those of clients' first requests: exact.
func TestReadmeQuickStart(t *testing.T) {
	limiterdBin := testbin.Need(t, testbin.Limiterd)
	curl := testbin.Need(t, testbin.Curl)
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	run, commands := readQuickStart(t, filepath.Join(root, "README.md"))
	if run != "make run" {
		t.Fatalf("the quick start's first block is %q, want `make run`", run)
	}

	checkDefaultAdminAddr(t, limiterdBin)
	// A rejection's answer holds only within a token's refill (200 ms) of the batch before it,
	// which a loaded machine may take between two commands: the quick start is run again on a
	// fresh limiterd, up to quickStartAttempts times, and fails when no run matches the README.
	// A README that is wrong fails every run.
	var r *quickStartRun
	for attempt := 1; attempt <= quickStartAttempts; attempt++ {
		r = runQuickStart(t, root, limiterdBin, curl, commands)
		if len(r.errs) == 0 {
			return
		}
		t.Logf("run %d of the quick start differed from the README:\n%s", attempt, strings.Join(r.errs, "\n"))
	}
	for _, e := range r.errs {
		t.Error(e)
	}
}

// quickStartAttempts is how many runs of the quick start TestReadmeQuickStart makes before it
// fails.
const quickStartAttempts = 3

// quickStartRun collects how one run of the quick start differed from the README.
type quickStartRun struct{ errs []string }

func (r *quickStartRun) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// runQuickStart starts bin/limiterd as `make run` does, on free ports, runs the commands through
// bash and checks each against its answer in the README.
func runQuickStart(t *testing.T, root, limiterdBin, curl string, commands []quickStartCommand) *quickStartRun {
	t.Helper()
	r := &quickStartRun{}
	decisions, admin := freeAddr(t), freeAddr(t)
	args := makeRunArgs(t, root, decisions)
	// The admin API on a free loopback port, where make run's limiterd takes 127.0.0.1:9090
	// (checked above), and no wait at the end: how it stops is no part of the quick start.
	args = append(args, "--admin-addr", admin, "--shutdown-delay", "0s")
	l := &limiterd{process: startProcess(t, "limiterd", "", limiterdBin, args...), decisions: "http://" + decisions, admin: "http://" + admin}
	defer l.stop(t) // a later run takes fresh ports and a fresh store
	testsupport.Eventually(t, waitTimeout, "limiterd ready", func() error {
		if !l.running() {
			t.Fatalf("limiterd exited: %v\n%s", l.err, l.logs)
		}
		return get(l.admin + "/readyz")
	})

	ports := strings.NewReplacer(quickStartDecisions, "localhost:"+port(decisions), quickStartAdmin, "localhost:"+port(admin))
	env := append(os.Environ(), "LC_ALL=C", "PATH="+filepath.Dir(curl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, c := range commands {
		if !strings.Contains(c.shell, quickStartDecisions) && !strings.Contains(c.shell, quickStartAdmin) {
			t.Errorf("README.md:%d: %q calls neither %s nor %s, the addresses of `make run`", c.line, c.shell, quickStartDecisions, quickStartAdmin)
			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", ports.Replace(c.shell))
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		if err != nil {
			r.Errorf("README.md:%d: %s: %v\n%s%s", c.line, c.shell, err, out, stderr.String())
			continue
		}
		switch {
		case len(c.answer) == 0:
			if bytes.HasPrefix(bytes.TrimSpace(out), []byte(`{"error"`)) {
				r.Errorf("README.md:%d: %s answered an error: %s", c.line, c.shell, out)
			}
		case strings.Contains(" "+c.shell+" ", " -i "):
			checkHTTPAnswer(r, c, string(out))
		default:
			if got, want := normalizeLines(string(out)), normalizeLines(strings.Join(c.answer, "\n")); got != want {
				r.Errorf("README.md:%d: %s printed\n%s\nthe README shows\n%s", c.line, c.shell, got, want)
			}
		}
	}
	return r
}

// readQuickStart returns the first command of the section "Quick start" of the README at path
// and the commands of its second sh block, each with the answer shown after it.
func readQuickStart(t *testing.T, path string) (run string, commands []quickStartCommand) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		inSection, inBlock bool
		blocks             int
		current            *quickStartCommand
		continued          bool
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Quick start"
			continue
		case !inSection:
			continue
		case line == "```sh" && !inBlock:
			inBlock, current = true, nil
			blocks++
			continue
		case line == "```" && inBlock:
			inBlock = false
			continue
		case !inBlock || blocks > 2:
			continue
		}
		trimmed := strings.TrimSpace(line)
		if blocks == 1 {
			if run == "" && trimmed != "" && !strings.HasPrefix(trimmed, "#") {
				run, _, _ = strings.Cut(trimmed, "#")
				run = strings.TrimSpace(run)
			}
			continue
		}
		switch {
		case continued:
			current.shell += "\n" + line
		case trimmed == "":
			current = nil
		case strings.HasPrefix(trimmed, "#"):
			if current != nil {
				current.answer = append(current.answer, strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " "))
			}
		default:
			commands = append(commands, quickStartCommand{line: n, shell: line})
			current = &commands[len(commands)-1]
		}
		continued = current != nil && len(current.answer) == 0 && strings.HasSuffix(line, `\`)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if blocks < 2 || len(commands) == 0 {
		t.Fatalf("README.md: no commands in a second sh block of the section Quick start (%d blocks)", blocks)
	}
	return run, commands
}

// makeRunArgs returns the arguments `make run` gives bin/limiterd (the Makefile's recipe), with
// the decisions on addr in place of RUN_ADDR, whose default must be the README's address.
func makeRunArgs(t *testing.T, root, addr string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	makefile := string(b)
	m := regexp.MustCompile(`(?m)^RUN_ADDR \?= (\S+)$`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatal("Makefile: no RUN_ADDR ?= default")
	}
	if want := "127.0.0.1:" + port(quickStartDecisions); m[1] != want {
		t.Errorf("Makefile: RUN_ADDR defaults to %s; the README calls %s", m[1], quickStartDecisions)
	}
	recipe := regexp.MustCompile(`(?m)^run:.*\n\t(.*)$`).FindStringSubmatch(makefile)
	if recipe == nil {
		t.Fatal("Makefile: no recipe for run")
	}
	fields := strings.Fields(recipe[1])
	if len(fields) == 0 || fields[0] != "$(BIN)/limiterd" {
		t.Fatalf("Makefile: run's recipe %q does not start with $(BIN)/limiterd", recipe[1])
	}
	var args []string
	for _, f := range fields[1:] {
		switch {
		case f == "$(RUN_ADDR)":
			f = addr
		case strings.Contains(f, "$("):
			t.Fatalf("Makefile: run's recipe %q: the test knows no %s", recipe[1], f)
		case !strings.HasPrefix(f, "-") && exists(filepath.Join(root, f)):
			f = filepath.Join(root, f) // make runs in the repository's root
		}
		args = append(args, f)
	}
	return args
}

// checkDefaultAdminAddr checks that limiterd's admin API with policy files only is the README's
// address by default.
func checkDefaultAdminAddr(t *testing.T, binary string) {
	t.Helper()
	out, _ := exec.Command(binary, "--help").CombinedOutput() // --help exits 0 or 2 by version of flag
	m := regexp.MustCompile(`127\.0\.0\.1:(\d+) with policy files only`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("limiterd --help names no default admin address with policy files only:\n%s", out)
	}
	if string(m[1]) != port(quickStartAdmin) {
		t.Errorf("limiterd's admin API defaults to 127.0.0.1:%s with policy files only; the README calls %s", m[1], quickStartAdmin)
	}
}

// checkHTTPAnswer checks the output of curl -i against the answer the README shows: its status
// line, each header it shows, and its body.
func checkHTTPAnswer(t interface{ Errorf(string, ...any) }, c quickStartCommand, out string) {
	head, body, ok := strings.Cut(strings.ReplaceAll(out, "\r\n", "\n"), "\n\n")
	if !ok {
		t.Errorf("README.md:%d: %s: no HTTP answer in\n%s", c.line, c.shell, out)
		return
	}
	lines := strings.Split(head, "\n")
	status, headers := lines[0], map[string][]string{}
	for _, l := range lines[1:] {
		name, value, _ := strings.Cut(l, ":")
		headers[strings.ToLower(name)] = append(headers[strings.ToLower(name)], strings.TrimSpace(value))
	}
	var wantBody strings.Builder
	for _, a := range c.answer {
		switch {
		case wantBody.Len() > 0 || strings.HasPrefix(a, "{"):
			wantBody.WriteString(strings.TrimSpace(a))
		case strings.HasPrefix(a, "HTTP/"):
			if status != a {
				t.Errorf("README.md:%d: %s: status %q, the README shows %q", c.line, c.shell, status, a)
			}
		default:
			name, value, ok := strings.Cut(a, ": ")
			if !ok {
				t.Errorf("README.md:%d: the answer's line %q is no status, header or body", c.line, a)
				continue
			}
			if got := headers[strings.ToLower(name)]; len(got) != 1 || got[0] != value {
				t.Errorf("README.md:%d: %s: header %s %q, the README shows %q", c.line, c.shell, name, got, value)
			}
		}
	}
	if wantBody.Len() > 0 {
		if err := matchBody(strings.TrimSpace(body), wantBody.String()); err != nil {
			t.Errorf("README.md:%d: %s: body %s: %v", c.line, c.shell, strings.TrimSpace(body), err)
		}
	}
}

// msFields are the fields of a rejection that count down between the commands: their values may
// differ from the README's by less than timeSlackMs.
var msFields = map[string]bool{"resetAfterMs": true, "retryAfterMs": true}

const timeSlackMs = 200

// matchBody matches a JSON body against the README's: with "...", each part between them must
// appear in order, the first at the start and the last at the end; without, the same fields
// with the same values (a rejection's msFields within timeSlackMs).
func matchBody(got, want string) error {
	if parts := strings.Split(want, "..."); len(parts) > 1 {
		rest := got
		for i, p := range parts {
			j := strings.Index(rest, p)
			switch {
			case j < 0, i == 0 && j != 0:
				return fmt.Errorf("does not hold %q where the README shows it", p)
			case i == len(parts)-1 && !strings.HasSuffix(rest, p):
				return fmt.Errorf("does not end with %q", p)
			}
			rest = rest[j+len(p):]
		}
		return nil
	}
	decode := func(s string) (map[string]json.RawMessage, error) {
		var m map[string]json.RawMessage
		err := json.Unmarshal([]byte(s), &m)
		return m, err
	}
	g, err := decode(got)
	if err != nil {
		return err
	}
	w, err := decode(want)
	if err != nil {
		return fmt.Errorf("the README's body %s: %w", want, err)
	}
	rejection := string(w["allowed"]) == "false"
	if len(g) != len(w) {
		return fmt.Errorf("%d fields, the README shows %d: %s", len(g), len(w), want)
	}
	for k, wv := range w {
		gv, ok := g[k]
		switch {
		case !ok:
			return fmt.Errorf("no field %s", k)
		case rejection && msFields[k]:
			gn, gerr := strconv.Atoi(string(gv))
			wn, werr := strconv.Atoi(string(wv))
			if gerr != nil || werr != nil || gn-wn >= timeSlackMs || wn-gn >= timeSlackMs {
				return fmt.Errorf("%s is %s, the README shows %s", k, gv, wv)
			}
		case !bytes.Equal(gv, wv):
			return fmt.Errorf("%s is %s, the README shows %s", k, gv, wv)
		}
	}
	return nil
}

// normalizeLines returns s's non-blank lines with their runs of spaces made one.
func normalizeLines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return strings.Join(out, "\n")
}

// port returns the port of a host:port address.
func port(addr string) string {
	_, p, _ := strings.Cut(addr, ":")
	return p
}

// exists reports whether path names a file.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
