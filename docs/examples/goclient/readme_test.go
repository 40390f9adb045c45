package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestReadmeGoCode keeps README.md's Go code compiling as written: its ```go block is this
// program verbatim (which the module's build and vet compile), it has no other, and no inline
// code calls a method on client.New's results (New returns an error too).
func TestReadmeGoCode(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```\n").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Error("README.md does not show docs/examples/goclient/main.go in a ```go block")
	}
	for i, b := range blocks {
		if b[1] != string(program) {
			t.Errorf("README.md's ```go block %d is not docs/examples/goclient/main.go, the program that is compiled: copy it there\n%s", i+1, b[1])
		}
	}
	if m := regexp.MustCompile(`client\.New\([^()]*\)\.`).FindAllString(string(readme), -1); m != nil {
		t.Errorf("README.md calls a method on client.New's results, which does not compile (New returns an error too): %q", m)
	}
}
