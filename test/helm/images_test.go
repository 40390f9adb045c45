package helm_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
)

// makeOutput runs make in the repository root and returns its stdout.
func makeOutput(t testing.TB, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", append([]string{"-s", "--no-print-directory", "-C", repoRoot(t)}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

// TestImagesMatchChart checks that the images `make docker-build` tags are the chart's default
// images: same repositories, tag = the chart's appVersion.
func TestImagesMatchChart(t *testing.T) {
	t.Parallel()
	_, appVersion := chartMeta(t)
	images := strings.Fields(makeOutput(t, "docker-images"))
	want := []string{"ghcr.io/limiterd/limiterd:" + appVersion, "ghcr.io/limiterd/manager:" + appVersion}
	if !slices.Equal(images, want) {
		t.Fatalf("make docker-images = %v, want %v", images, want)
	}
	m := render(t)
	var rendered []string
	for _, d := range m.ofKind("Deployment") {
		for _, c := range typed[appsv1.Deployment](t, d).Spec.Template.Spec.Containers {
			rendered = append(rendered, c.Image)
		}
	}
	slices.Sort(rendered)
	if !slices.Equal(rendered, want) {
		t.Errorf("chart images %v, want those of make docker-images %v", rendered, want)
	}

	// docker-build builds each image from its Dockerfile with that tag (make -n: print only).
	build := makeOutput(t, "-n", "docker-build")
	for _, pair := range [][2]string{{"Dockerfile.limiterd", want[0]}, {"Dockerfile.manager", want[1]}} {
		if !strings.Contains(build, "-f "+pair[0]+" -t "+pair[1]+" .") {
			t.Errorf("make -n docker-build does not build %s from %s:\n%s", pair[1], pair[0], build)
		}
	}
	// VERSION overrides the tag.
	if got := strings.Fields(makeOutput(t, "docker-images", "VERSION=9.9.9")); !slices.Equal(got, []string{"ghcr.io/limiterd/limiterd:9.9.9", "ghcr.io/limiterd/manager:9.9.9"}) {
		t.Errorf("make docker-images VERSION=9.9.9 = %v", got)
	}
}

// dockerfile is a parsed Dockerfile: its instructions, continuation lines joined.
type dockerfile struct {
	instructions [][2]string // {"FROM", "golang:1.26 AS build"}
}

func parseDockerfile(t testing.TB, path string) dockerfile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		d    dockerfile
		line string
	)
	s := bufio.NewScanner(f)
	for s.Scan() {
		l := strings.TrimSpace(s.Text())
		if line == "" && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if c, ok := strings.CutSuffix(l, `\`); ok {
			line += c + " "
			continue
		}
		line += l
		op, args, _ := strings.Cut(line, " ")
		d.instructions = append(d.instructions, [2]string{strings.ToUpper(op), strings.TrimSpace(args)})
		line = ""
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDockerfiles checks both Dockerfiles: a golang:1.26 builder compiling a static binary
// (CGO_ENABLED=0, -trimpath) from sources that cover every package of the binary, and a
// distroless static nonroot final image running as 65532.
func TestDockerfiles(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, tc := range []struct {
		file, pkg, binary string
	}{
		{"Dockerfile.limiterd", "./cmd/limiterd", "/limiterd"},
		{"Dockerfile.manager", ".", "/manager"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			d := parseDockerfile(t, filepath.Join(root, tc.file))
			var froms []string
			last := -1
			for i, in := range d.instructions {
				if in[0] == "FROM" {
					froms = append(froms, in[1])
					last = i
				}
			}
			if len(froms) != 2 {
				t.Fatalf("stages %v, want a builder and a final stage", froms)
			}
			if !regexp.MustCompile(`^(--platform=\S+ )?golang:1\.26(\.\d+)?(-\S+)?(@sha256:[0-9a-f]{64})? AS build$`).MatchString(froms[0]) {
				t.Errorf("builder stage %q, want golang:1.26 AS build", froms[0])
			}
			if !regexp.MustCompile(`^(gcr\.io/distroless/static(-debian\d+)?:nonroot|scratch)(@sha256:[0-9a-f]{64})?$`).MatchString(froms[1]) {
				t.Errorf("final stage %q, want scratch (or distroless static nonroot)", froms[1])
			}
			var (
				build        string
				copied       []string // source paths copied into the builder
				user, entry  string
				copiedBinary bool
			)
			for i, in := range d.instructions {
				switch {
				case in[0] == "RUN" && strings.Contains(in[1], "go build"):
					build = in[1]
				case in[0] == "COPY" && i < last:
					fields := strings.Fields(in[1])
					copied = append(copied, fields[:len(fields)-1]...)
				case in[0] == "COPY" && i > last:
					copiedBinary = copiedBinary || (strings.HasPrefix(in[1], "--from=build ") && strings.HasSuffix(in[1], " "+tc.binary))
				case in[0] == "USER" && i > last:
					user = in[1]
				case in[0] == "ENTRYPOINT" && i > last:
					entry = in[1]
				}
			}
			for _, w := range []string{"CGO_ENABLED=0", "-trimpath", "-o /out" + tc.binary, tc.pkg} {
				if !strings.Contains(build, w) {
					t.Errorf("go build step %q lacks %q", build, w)
				}
			}
			if !copiedBinary {
				t.Errorf("final stage does not copy %s from the builder", tc.binary)
			}
			if user != "65532:65532" && user != "65532" {
				t.Errorf("USER %q, want 65532", user)
			}
			if entry != `["`+tc.binary+`"]` {
				t.Errorf("ENTRYPOINT %s, want [%q]", entry, tc.binary)
			}
			for _, want := range []string{"go.mod", "go.sum"} {
				if !slices.Contains(copied, want) {
					t.Errorf("builder does not copy %s", want)
				}
			}

			// Every package of the binary (and its embedded files) is under a copied path.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-f", `{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}`, tc.pkg)
			cmd.Dir = root
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", tc.pkg, err)
			}
			for _, dir := range strings.Fields(string(out)) {
				rel, err := filepath.Rel(root, dir)
				if err != nil {
					t.Fatal(err)
				}
				rel = filepath.ToSlash(rel)
				covered := slices.ContainsFunc(copied, func(c string) bool {
					c = strings.TrimSuffix(strings.TrimPrefix(c, "./"), "/")
					return c == "." || rel == c || strings.HasPrefix(rel+"/", c+"/") ||
						(rel == "." && strings.HasSuffix(c, ".go") && !strings.Contains(c, "/"))
				})
				if !covered {
					t.Errorf("%s builds package directory %s, which no COPY brings into the builder (copied %v)", tc.pkg, rel, copied)
				}
			}
		})
	}
}
