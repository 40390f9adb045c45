package ociimage_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/hack/internal/ociimage"
)

const dockerfile = `# syntax=docker/dockerfile:1
FROM golang:1.26 AS build
RUN go build -o /out/app .

FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title="app" \
      org.opencontainers.image.version="${VERSION}"
COPY rootfs/ /
COPY --from=build /out/app /app
USER 65532:65532
EXPOSE 8080 9090/udp
ENTRYPOINT ["/app"]
`

// fixture writes a build context with a Dockerfile, a rootfs directory and a "binary".
func fixture(t *testing.T, df string) ociimage.Spec {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, data string, mode os.FileMode) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("Dockerfile", df, 0o644)
	write("rootfs/etc/passwd", "nonroot:x:65532:65532::/:/sbin/nologin\n", 0o600) // umask-dependent mode
	write("rootfs/etc/group", "nonroot:x:65532:\n", 0o644)
	write("app", "\x7fELF fake binary", 0o700)
	return ociimage.Spec{
		Dockerfile: filepath.Join(dir, "Dockerfile"),
		Context:    dir,
		BuildArgs:  map[string]string{"VERSION": "1.2.3"},
		StageFiles: map[string]string{"/out/app": filepath.Join(dir, "app")},
		Ref:        "example.test/app:1.2.3",
		Created:    time.Unix(1700000000, 0),
	}
}

func archive(t *testing.T, spec ociimage.Spec) (*ociimage.Image, []byte) {
	t.Helper()
	img, err := ociimage.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := img.WriteArchive(&buf, spec.Ref); err != nil {
		t.Fatal(err)
	}
	return img, buf.Bytes()
}

// entries reads a tar into name -> contents, checking every entry's time.
func entries(t *testing.T, r io.Reader, mtime time.Time) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	files, headers := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, headers
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, mtime)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], headers[h.Name] = data, h
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func TestBuildArchive(t *testing.T) {
	spec := fixture(t, dockerfile)
	img, data := archive(t, spec)
	files, _ := entries(t, bytes.NewReader(data), spec.Created)

	// The OCI layout: index.json names the image for containerd and points at the manifest.
	var index ociimage.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Digest != img.Digest ||
		index.Manifests[0].Annotations["io.containerd.image.name"] != spec.Ref ||
		index.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "1.2.3" {
		t.Fatalf("index.json = %s", files["index.json"])
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", files["oci-layout"])
	}
	blob := func(digest string) []byte {
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", digest)
		}
		if sha(b) != digest {
			t.Fatalf("blob %s has digest %s", digest, sha(b))
		}
		return b
	}
	var m ociimage.Manifest
	if err := json.Unmarshal(blob(img.Digest), &m); err != nil {
		t.Fatal(err)
	}
	var cfg ociimage.ImageConfig
	if err := json.Unmarshal(blob(m.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/app"}) ||
		c.Labels["org.opencontainers.image.version"] != "1.2.3" || c.Labels["org.opencontainers.image.title"] != "app" ||
		len(c.ExposedPorts) != 2 || cfg.OS != "linux" || cfg.Architecture != "amd64" || !cfg.Created.Equal(spec.Created) {
		t.Errorf("image config = %s", blob(m.Config.Digest))
	}
	if _, ok := c.ExposedPorts["9090/udp"]; !ok {
		t.Errorf("exposed ports %v lack 9090/udp", c.ExposedPorts)
	}

	// docker load's manifest.json names the same config and layer.
	var docker []ociimage.DockerManifest
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil {
		t.Fatal(err)
	}
	if len(docker) != 1 || !slices.Equal(docker[0].RepoTags, []string{spec.Ref}) ||
		docker[0].Config != "blobs/sha256/"+strings.TrimPrefix(m.Config.Digest, "sha256:") ||
		!slices.Equal(docker[0].Layers, []string{"blobs/sha256/" + strings.TrimPrefix(m.Layers[0].Digest, "sha256:")}) {
		t.Errorf("manifest.json = %s", files["manifest.json"])
	}

	// The layer: exactly the copied files, owned by root, normalised modes, diff ID in the config.
	zr, err := gzip.NewReader(bytes.NewReader(blob(m.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.RootFS.DiffIDs, []string{sha(raw)}) {
		t.Errorf("diff IDs %v, want [%s]", cfg.RootFS.DiffIDs, sha(raw))
	}
	layer, headers := entries(t, bytes.NewReader(raw), spec.Created)
	var names []string
	for name, h := range headers {
		names = append(names, name+" "+os.FileMode(h.Mode).String())
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d", name, h.Uid, h.Gid)
		}
	}
	slices.Sort(names)
	want := []string{"app -rwxr-xr-x", "etc/ -rwxr-xr-x", "etc/group -rw-r--r--", "etc/passwd -rw-r--r--"}
	if !slices.Equal(names, want) {
		t.Errorf("layer entries %q, want %q", names, want)
	}
	if string(layer["app"]) != "\x7fELF fake binary" {
		t.Errorf("app = %q", layer["app"])
	}
}

// TestBuildReproducible builds the same inputs twice (and once with other file times on disk):
// the archives are byte for byte equal; another build argument gives another digest.
func TestBuildReproducible(t *testing.T) {
	spec := fixture(t, dockerfile)
	img1, a1 := archive(t, spec)
	old := time.Unix(1, 0)
	if err := os.Chtimes(filepath.Join(spec.Context, "rootfs/etc/group"), old, old); err != nil {
		t.Fatal(err)
	}
	img2, a2 := archive(t, spec)
	if img1.Digest != img2.Digest || !bytes.Equal(a1, a2) {
		t.Errorf("two builds differ: %s, %s", img1.Digest, img2.Digest)
	}
	spec.BuildArgs = map[string]string{"VERSION": "1.2.4"}
	if img3, _ := archive(t, spec); img3.Digest == img1.Digest {
		t.Errorf("VERSION 1.2.4 gives the digest of 1.2.3")
	}
}

func TestBuildRefusals(t *testing.T) {
	for name, tc := range map[string]struct{ dockerfile, ref string }{
		"base image":          {"FROM alpine:3\nENTRYPOINT [\"/app\"]\n", "a/b:1"},
		"RUN in final stage":  {"FROM scratch\nRUN true\n", "a/b:1"},
		"shell entrypoint":    {"FROM scratch\nENTRYPOINT /app\n", "a/b:1"},
		"unknown stage file":  {"FROM scratch\nCOPY --from=build /out/other /other\n", "a/b:1"},
		"missing context dir": {"FROM scratch\nCOPY nothing/ /\n", "a/b:1"},
		"no FROM":             {"ENTRYPOINT [\"/app\"]\n", "a/b:1"},
		"ref without tag":     {dockerfile, "example.test/app"},
		"bad label":           {"FROM scratch\nLABEL novalue\n", "a/b:1"},
	} {
		t.Run(name, func(t *testing.T) {
			spec := fixture(t, tc.dockerfile)
			spec.Ref = tc.ref
			if _, err := ociimage.Build(spec); err == nil {
				t.Errorf("Build succeeded, want an error")
			}
		})
	}
}

// TestRepositoryDockerfiles builds the repository's own Dockerfiles' final stages (with stand-in
// binaries): they are FROM scratch with only what hack/ociimage supports, run as 65532, and carry
// the OCI labels.
func TestRepositoryDockerfiles(t *testing.T) {
	root, err := filepath.Abs("../../..") // the module root, from hack/internal/ociimage
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, binary string }{
		{"Dockerfile.limiterd", "/limiterd"},
		{"Dockerfile.manager", "/manager"},
		{"hack/node/pause/Dockerfile", "/pause"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			img, err := ociimage.Build(ociimage.Spec{
				Dockerfile: filepath.Join(root, tc.file), Context: root,
				BuildArgs:  map[string]string{"VERSION": "9.9.9", "REVISION": "abc"},
				StageFiles: map[string]string{"/out" + tc.binary: bin},
				Ref:        "example.test/x:9.9.9", Created: time.Unix(0, 0),
			})
			if err != nil {
				t.Fatal(err)
			}
			c := img.Config.Config
			if !slices.Equal(c.Entrypoint, []string{tc.binary}) || !strings.HasPrefix(c.User, "6553") {
				t.Errorf("entrypoint %v user %q", c.Entrypoint, c.User)
			}
			if tc.file == "hack/node/pause/Dockerfile" {
				return
			}
			if tc.file == "Dockerfile.limiterd" {
				// The ports of SECURITY.md: decisions, gRPC (Envoy's rate-limit service), admin.
				if want := []string{"8080/tcp", "8081/tcp", "9090/tcp"}; !slices.Equal(slices.Sorted(maps.Keys(c.ExposedPorts)), want) {
					t.Errorf("exposed ports %v, want %v", c.ExposedPorts, want)
				}
			}
			if c.User != "65532:65532" || c.Labels["org.opencontainers.image.version"] != "9.9.9" ||
				c.Labels["org.opencontainers.image.revision"] != "abc" || c.Labels["org.opencontainers.image.source"] == "" {
				t.Errorf("config %+v", c)
			}
			var paths []string
			for _, f := range img.Files {
				paths = append(paths, f.Path)
			}
			if want := []string{"/", "/etc", "/etc/group", "/etc/passwd", tc.binary}; !slices.Equal(paths, want) {
				t.Errorf("files %v, want %v", paths, want)
			}
		})
	}
}
