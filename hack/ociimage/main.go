// Command ociimage builds a container image from a Dockerfile's FROM scratch final stage without
// a container daemon (hack/internal/ociimage) and writes it as an archive for `ctr images import` and
// `docker load`. `make images` runs it; it prints the image's manifest digest.
//
//	ociimage -dockerfile Dockerfile.limiterd -ref ghcr.io/limiterd/limiterd:0.1.0 \
//	    -stage-file /out/limiterd=bin/image/limiterd -build-arg VERSION=0.1.0 -o bin/images/limiterd.tar
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/limiterd/limiterd/hack/internal/ociimage"
)

type pairs map[string]string

func (p pairs) String() string { return fmt.Sprint(map[string]string(p)) }

func (p pairs) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	p[k] = v
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run() error {
	spec := ociimage.Spec{BuildArgs: pairs{}, StageFiles: pairs{}}
	var out, epoch string
	flag.StringVar(&spec.Dockerfile, "dockerfile", "", "the Dockerfile whose FROM scratch final stage describes the image")
	flag.StringVar(&spec.Context, "context", ".", "the directory COPY sources without --from are relative to")
	flag.StringVar(&spec.Ref, "ref", "", "the image's name:tag")
	flag.StringVar(&spec.Architecture, "arch", runtime.GOARCH, "the image's architecture (the binaries' GOARCH)")
	flag.Var(pairs(spec.BuildArgs), "build-arg", "NAME=VALUE of an ARG (repeatable)")
	flag.Var(pairs(spec.StageFiles), "stage-file", "PATH=FILE: the local FILE for PATH of a COPY --from=<stage> (repeatable)")
	flag.StringVar(&epoch, "epoch", os.Getenv("SOURCE_DATE_EPOCH"), "creation time in Unix seconds (default $SOURCE_DATE_EPOCH, required)")
	flag.StringVar(&out, "o", "", "the archive to write")
	flag.Parse()
	if spec.Dockerfile == "" || spec.Ref == "" || out == "" || flag.NArg() != 0 {
		return errors.New("usage: ociimage -dockerfile FILE -ref NAME:TAG -o ARCHIVE [-stage-file PATH=FILE]... [-build-arg NAME=VALUE]...") //nolint:revive,staticcheck // a usage line, printed as is
	}
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("-epoch (or SOURCE_DATE_EPOCH) %q: want Unix seconds: %w", epoch, err)
	}
	spec.Created = time.Unix(secs, 0)
	img, err := ociimage.Build(spec)
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("create archive: %w", err)
	}
	w := bufio.NewWriter(f)
	if err := img.WriteArchive(w, spec.Ref); err != nil {
		_ = f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	fmt.Printf("%s %s %s\n", out, spec.Ref, img.Digest)
	return nil
}
