package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestDocsGoCode keeps the Go code of the README and docs/ compiling as written: docs/go-client.md
// shows this program verbatim (which the module's build and vet compile) in a ```go block, no
// page has another ```go block, and no inline code calls a method on client.New's results (New
// returns an error too).
func TestDocsGoCode(t *testing.T) {
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join("..", "..", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]string{"README.md": filepath.Join("..", "..", "..", "README.md")} // name: path
	for _, p := range docs {
		pages["docs/"+filepath.Base(p)] = p
	}
	goBlock := regexp.MustCompile("(?s)```go\n(.*?)```\n")
	callOnNew := regexp.MustCompile(`client\.New\([^()]*\)\.`)
	shown := false
	for name, path := range pages {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range goBlock.FindAllStringSubmatch(string(text), -1) {
			if b[1] != string(program) {
				t.Errorf("%s's ```go block %d is not docs/examples/goclient/main.go, the program that is compiled: copy it there\n%s", name, i+1, b[1])
			} else if name == "docs/go-client.md" {
				shown = true
			}
		}
		if m := callOnNew.FindAllString(string(text), -1); m != nil {
			t.Errorf("%s calls a method on client.New's results, which does not compile (New returns an error too): %q", name, m)
		}
	}
	if !shown {
		t.Error("docs/go-client.md does not show docs/examples/goclient/main.go in a ```go block")
	}
}
