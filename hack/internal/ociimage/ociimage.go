// Package ociimage builds a container image from the final stage of a Dockerfile, without a
// container daemon, and writes it as one archive that both `ctr images import` (an OCI image
// layout: oci-layout, index.json, blobs/) and `docker load` (manifest.json) accept.
//
// The final stage must start FROM scratch; it may use ARG, LABEL, COPY, USER, EXPOSE, ENTRYPOINT
// and ENV. Files COPY'd --from an earlier stage are taken from the paths the caller gives (the
// binaries it built), other COPY sources from the build context. The result is one layer whose
// entries are sorted, owned by root and stamped with one time, so the same inputs give the same
// image digest.
package ociimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Media types written into the archive.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// Spec is what an image is built from.
type Spec struct {
	// Dockerfile is the path of the Dockerfile whose final stage describes the image.
	Dockerfile string
	// Context is the directory COPY sources without --from are relative to.
	Context string
	// BuildArgs are the values of ARGs (a declared default applies to an ARG not listed).
	BuildArgs map[string]string
	// StageFiles maps a path in an earlier stage (the source of a COPY --from=...) to the local
	// file that holds it.
	StageFiles map[string]string
	// Ref is the image's name with its tag, e.g. ghcr.io/limiterd/limiterd:0.1.0.
	Ref string
	// Created is the image's creation time and the time of every file in its layer.
	Created time.Time
	// OS and Architecture of the image; empty means linux and amd64.
	OS, Architecture string
}

// Config is the runtime part of an image configuration (the OCI image config's "config").
type Config struct {
	User         string              `json:"User,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Labels       map[string]string   `json:"Labels,omitempty"`
}

// ImageConfig is the OCI image configuration.
type ImageConfig struct {
	Created      time.Time `json:"created"`
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Config       Config    `json:"config"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []History `json:"history,omitempty"`
}

// History is one entry of an image configuration's history.
type History struct {
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by"`
}

// Descriptor points at a blob.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Index is an OCI image index (index.json).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// DockerManifest is one entry of the manifest.json that docker load reads.
type DockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// File is one regular file or directory of the image's layer.
type File struct {
	Path string // absolute path in the image, e.g. /etc/passwd
	Mode fs.FileMode
	Data []byte // nil for a directory
}

// Image is a built image: its configuration, files and the blobs written to the archive.
type Image struct {
	Config   ImageConfig
	Files    []File // sorted by path, directories included
	Manifest Manifest
	// Digest is the manifest's digest, the image's identity (sha256:...).
	Digest string

	configBlob, layerBlob, manifestBlob []byte
}

// Build reads the Dockerfile's final stage and assembles the image it describes.
func Build(spec Spec) (*Image, error) {
	if spec.Ref == "" || !strings.Contains(path.Base(spec.Ref), ":") {
		return nil, fmt.Errorf("image reference %q: want name:tag", spec.Ref)
	}
	instrs, err := finalStage(spec.Dockerfile)
	if err != nil {
		return nil, err
	}
	created := spec.Created.UTC()
	img := &Image{Config: ImageConfig{Created: created, OS: "linux", Architecture: "amd64"}}
	if spec.OS != "" {
		img.Config.OS = spec.OS
	}
	if spec.Architecture != "" {
		img.Config.Architecture = spec.Architecture
	}
	args := map[string]string{}
	files := map[string]File{"/": {Path: "/", Mode: fs.ModeDir | 0o755}}
	cfg := &img.Config.Config
	for _, in := range instrs {
		switch in.op {
		case "ARG":
			name, def, hasDefault := strings.Cut(in.args, "=")
			if v, ok := spec.BuildArgs[name]; ok {
				args[name] = v
			} else if hasDefault {
				args[name] = unquote(def)
			} else {
				args[name] = ""
			}
		case "LABEL":
			pairs, err := splitPairs(expand(in.args, args))
			if err != nil {
				return nil, fmt.Errorf("%s: LABEL %s: %w", spec.Dockerfile, in.args, err)
			}
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			for _, p := range pairs {
				cfg.Labels[p[0]] = p[1]
			}
		case "ENV":
			pairs, err := splitPairs(expand(in.args, args))
			if err != nil {
				return nil, fmt.Errorf("%s: ENV %s: %w", spec.Dockerfile, in.args, err)
			}
			for _, p := range pairs {
				cfg.Env = append(cfg.Env, p[0]+"="+p[1])
			}
		case "USER":
			cfg.User = expand(in.args, args)
		case "EXPOSE":
			if cfg.ExposedPorts == nil {
				cfg.ExposedPorts = map[string]struct{}{}
			}
			for _, p := range strings.Fields(expand(in.args, args)) {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				cfg.ExposedPorts[p] = struct{}{}
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &cfg.Entrypoint); err != nil {
				return nil, fmt.Errorf("%s: ENTRYPOINT must be a JSON array: %w", spec.Dockerfile, err)
			}
		case "COPY":
			if err := spec.copy(files, expand(in.args, args)); err != nil {
				return nil, fmt.Errorf("%s: COPY %s: %w", spec.Dockerfile, in.args, err)
			}
		default:
			return nil, fmt.Errorf("%s: the final stage may not use %s", spec.Dockerfile, in.op)
		}
	}
	for _, f := range files {
		img.Files = append(img.Files, f)
	}
	slices.SortFunc(img.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })

	layer, diffID, err := layerTar(img.Files, created)
	if err != nil {
		return nil, err
	}
	img.layerBlob = layer
	img.Config.RootFS.Type = "layers"
	img.Config.RootFS.DiffIDs = []string{diffID}
	img.Config.History = []History{{Created: created, CreatedBy: "ociimage " + filepath.Base(spec.Dockerfile)}}
	if img.configBlob, err = json.Marshal(img.Config); err != nil {
		return nil, fmt.Errorf("encode image config: %w", err)
	}
	img.Manifest = Manifest{
		SchemaVersion: 2,
		MediaType:     MediaTypeManifest,
		Config:        descriptor(MediaTypeConfig, img.configBlob),
		Layers:        []Descriptor{descriptor(MediaTypeLayer, img.layerBlob)},
	}
	if img.manifestBlob, err = json.Marshal(img.Manifest); err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	img.Digest = digest(img.manifestBlob)
	return img, nil
}

// WriteArchive writes the image as a tar holding an OCI image layout, named ref in index.json
// (io.containerd.image.name, org.opencontainers.image.ref.name), and the manifest.json of docker
// save. Entries carry the image's creation time, so the archive is reproducible too.
func (img *Image) WriteArchive(w io.Writer, ref string) error {
	_, tag, _ := strings.Cut(path.Base(ref), ":")
	mdesc := descriptor(MediaTypeManifest, img.manifestBlob)
	mdesc.Annotations = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag}
	index, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{mdesc}})
	if err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	blob := func(b []byte) string { return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:") }
	docker, err := json.Marshal([]DockerManifest{{Config: blob(img.configBlob), RepoTags: []string{ref}, Layers: []string{blob(img.layerBlob)}}})
	if err != nil {
		return fmt.Errorf("encode manifest.json: %w", err)
	}
	tw := tar.NewWriter(w)
	mtime := img.Config.Created
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
	}
	entries := []struct {
		name string
		data []byte
	}{
		{blob(img.configBlob), img.configBlob},
		{blob(img.layerBlob), img.layerBlob},
		{blob(img.manifestBlob), img.manifestBlob},
		{"index.json", index},
		{"manifest.json", docker},
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
	}
	for _, e := range entries {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: mtime, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	return nil
}

// copy applies one COPY instruction to files.
func (spec Spec) copy(files map[string]File, args string) error {
	fields := strings.Fields(args)
	from := ""
	for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
		flag, value, _ := strings.Cut(fields[0], "=")
		switch flag {
		case "--from":
			from = value
		default:
			return fmt.Errorf("unsupported flag %s", fields[0])
		}
		fields = fields[1:]
	}
	if len(fields) != 2 {
		return errors.New("want one source and one destination")
	}
	src, dst := fields[0], fields[1]
	if !path.IsAbs(dst) {
		return fmt.Errorf("destination %s is not absolute", dst)
	}
	add := func(p string, mode fs.FileMode, data []byte) {
		p = path.Clean(p)
		for dir := path.Dir(p); dir != "/"; dir = path.Dir(dir) {
			if _, ok := files[dir]; !ok {
				files[dir] = File{Path: dir, Mode: fs.ModeDir | 0o755}
			}
		}
		files[p] = File{Path: p, Mode: mode, Data: data}
	}
	if from != "" {
		local, ok := spec.StageFiles[src]
		if !ok {
			return fmt.Errorf("no file given for %s of stage %s", src, from)
		}
		data, err := os.ReadFile(local)
		if err != nil {
			return fmt.Errorf("read %s: %w", src, err)
		}
		if strings.HasSuffix(dst, "/") {
			dst += path.Base(src)
		}
		add(dst, normalMode(0o755), data)
		return nil
	}
	root := filepath.Join(spec.Context, filepath.FromSlash(src))
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error { //nolint:wrapcheck // the walk function wraps its errors
		if err != nil {
			return fmt.Errorf("walk %s: %w", src, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return fmt.Errorf("walk %s: %w", src, err)
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		if rel == "." && !d.IsDir() && !strings.HasSuffix(dst, "/") {
			target = dst
		} else if rel == "." && !d.IsDir() {
			target = path.Join(dst, d.Name())
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("walk %s: %w", src, err)
		}
		switch {
		case d.IsDir():
			if target != "/" {
				add(target, fs.ModeDir|0o755, nil)
			}
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return fmt.Errorf("read %s: %w", p, err)
			}
			add(target, normalMode(info.Mode()), data)
		default:
			return fmt.Errorf("%s is neither a file nor a directory", p)
		}
		return nil
	})
}

// normalMode is 0755 for an executable file and 0644 otherwise: a checkout's umask must not
// change the image.
func normalMode(m fs.FileMode) fs.FileMode {
	if m&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

// layerTar returns the gzipped layer and the digest of its uncompressed tar (the diff ID).
func layerTar(files []File, mtime time.Time) (layer []byte, diffID string, err error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, f := range files {
		if f.Path == "/" {
			continue
		}
		name := strings.TrimPrefix(f.Path, "/")
		hdr := &tar.Header{Name: name, Mode: int64(f.Mode.Perm()), ModTime: mtime, Format: tar.FormatPAX, Uname: "", Gname: ""}
		if f.Mode.IsDir() {
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, "", fmt.Errorf("write layer: %w", err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, "", fmt.Errorf("write layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", fmt.Errorf("write layer: %w", err)
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return nil, "", fmt.Errorf("compress layer: %w", err)
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", fmt.Errorf("compress layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, "", fmt.Errorf("compress layer: %w", err)
	}
	return gz.Bytes(), digest(raw.Bytes()), nil
}

type instruction struct{ op, args string }

// finalStage returns the instructions after the Dockerfile's last FROM, which must be scratch.
func finalStage(dockerfile string) ([]instruction, error) {
	f, err := os.Open(dockerfile)
	if err != nil {
		return nil, fmt.Errorf("read Dockerfile: %w", err)
	}
	defer f.Close() //nolint:errcheck // read only
	var (
		all  []instruction
		line string
		last = -1
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
		op = strings.ToUpper(op)
		if op == "FROM" {
			last = len(all)
		}
		all = append(all, instruction{op, strings.TrimSpace(args)})
		line = ""
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", dockerfile, err)
	}
	if last < 0 {
		return nil, fmt.Errorf("%s has no FROM", dockerfile)
	}
	if base := strings.Fields(all[last].args); len(base) != 1 || base[0] != "scratch" {
		return nil, fmt.Errorf("%s: the final stage is FROM %s, want FROM scratch", dockerfile, all[last].args)
	}
	return all[last+1:], nil
}

// splitPairs splits `k1="v 1" k2=v2` into pairs.
func splitPairs(s string) ([][2]string, error) {
	var pairs [][2]string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		key, rest, ok := strings.Cut(s, "=")
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			return nil, fmt.Errorf("want key=value at %q", s)
		}
		var value string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				return nil, fmt.Errorf("unterminated quote at %q", rest)
			}
			value, rest = rest[1:end+1], rest[end+2:]
		} else {
			value, rest, _ = strings.Cut(rest, " ")
		}
		pairs = append(pairs, [2]string{key, value})
		s = rest
	}
	return pairs, nil
}

// expand replaces ${NAME} and $NAME with the ARG values.
func expand(s string, args map[string]string) string {
	return os.Expand(s, func(name string) string { return args[name] })
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func descriptor(mediaType string, b []byte) Descriptor {
	return Descriptor{MediaType: mediaType, Digest: digest(b), Size: int64(len(b))}
}
