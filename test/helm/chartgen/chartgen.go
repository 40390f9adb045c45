// Package chartgen generates the files of charts/limiterd that are derived from elsewhere, and
// checks that they are current:
//
//   - files/crds/*.yaml: copies of config/crd/bases/*.yaml (the CRD the chart installs);
//   - files/dashboards/limiterd.json: a copy of docs/grafana/limiterd.json;
//   - README.md: README.md.gotmpl filled with a reference of every value, taken from the
//     "# --" comments of values.yaml (helm-docs' convention).
//
// In values.yaml every key carries a description: a comment block above it whose first line
// starts with "# --"; the lines after it continue the description. A description may start with
// a type in brackets, "(int or string) ...", that replaces the type read from the default, and
// a last line "# @default -- text" replaces the default shown. A mapping whose children carry
// no description (resources, securityContext, labels) is documented as a whole; a mapping with
// described children is a section, and then each of its children must be described.
//
// hack/helm-docs.sh runs cmd/chartgen; the chart's tests call Check.
package chartgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"go.yaml.in/yaml/v3"
)

// ChartDir is the chart's directory, relative to the repository root.
const ChartDir = "charts/limiterd"

// File is a generated file: its path relative to the repository root and its content.
type File struct {
	Path    string
	Content []byte
}

// Value is one documented entry of values.yaml.
type Value struct {
	// Key is the dotted path, e.g. "limiterd.store.redis.addr".
	Key string
	// Type is "string", "int", "bool", "float", "list", "object", "null", or the type in
	// brackets at the start of the description.
	Type string
	// Default is the default as JSON, or the text of an "@default --" line.
	Default string
	// Description is the description, its lines joined by spaces.
	Description string
	// Section tells that the key's children are documented one by one.
	Section bool
	// Depth is the number of dots in Key.
	Depth int
}

// Generate returns the files derived from the repository rooted at root, in a stable order.
// Stale copies (files/crds/*.yaml with no counterpart in config/crd/bases) are reported by
// Check and removed by Write.
func Generate(root string) ([]File, error) {
	var files []File
	crds, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("list config/crd/bases: %w", err)
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("no CRD in %s", filepath.Join(root, "config", "crd", "bases"))
	}
	for _, src := range crds {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("read CRD: %w", err)
		}
		files = append(files, File{Path: filepath.ToSlash(filepath.Join(ChartDir, "files", "crds", filepath.Base(src))), Content: b})
	}
	dash, err := os.ReadFile(filepath.Join(root, "docs", "grafana", "limiterd.json"))
	if err != nil {
		return nil, fmt.Errorf("read dashboard: %w", err)
	}
	files = append(files, File{Path: ChartDir + "/files/dashboards/limiterd.json", Content: dash})

	values, err := ParseValues(filepath.Join(root, ChartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	readme, err := renderReadme(filepath.Join(root, ChartDir), values)
	if err != nil {
		return nil, err
	}
	files = append(files, File{Path: ChartDir + "/README.md", Content: readme})
	return files, nil
}

// stale returns the copies in files/crds that Generate no longer produces.
func stale(root string, files []File) ([]string, error) {
	have, err := filepath.Glob(filepath.Join(root, ChartDir, "files", "crds", "*"))
	if err != nil {
		return nil, fmt.Errorf("list CRD copies: %w", err)
	}
	var out []string
	for _, p := range have {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil, fmt.Errorf("CRD copy %s: %w", p, err)
		}
		rel = filepath.ToSlash(rel)
		if !slices.ContainsFunc(files, func(f File) bool { return f.Path == rel }) {
			out = append(out, rel)
		}
	}
	return out, nil
}

// Check returns an error naming every generated file that is missing, differs from what
// Generate produces, or is stale.
func Check(root string) error {
	files, err := Generate(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		have, err := os.ReadFile(filepath.Join(root, f.Path))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", f.Path, err))
		case !bytes.Equal(have, f.Content):
			errs = append(errs, fmt.Errorf("%s is out of date", f.Path))
		}
	}
	old, err := stale(root, files)
	if err != nil {
		return err
	}
	for _, p := range old {
		errs = append(errs, fmt.Errorf("%s is stale (no counterpart in config/crd/bases)", p))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w\nrun `make chart-docs` (hack/helm-docs.sh) to regenerate", err)
	}
	return nil
}

// Write writes the generated files under root and removes stale copies; it returns the paths
// it changed.
func Write(root string) ([]string, error) {
	files, err := Generate(root)
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, f := range files {
		p := filepath.Join(root, f.Path)
		if have, err := os.ReadFile(p); err == nil && bytes.Equal(have, f.Content) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return changed, fmt.Errorf("write %s: %w", f.Path, err)
		}
		if err := os.WriteFile(p, f.Content, 0o644); err != nil {
			return changed, fmt.Errorf("write %s: %w", f.Path, err)
		}
		changed = append(changed, f.Path)
	}
	old, err := stale(root, files)
	if err != nil {
		return changed, err
	}
	for _, p := range old {
		if err := os.Remove(filepath.Join(root, p)); err != nil {
			return changed, fmt.Errorf("remove stale %s: %w", p, err)
		}
		changed = append(changed, p)
	}
	return changed, nil
}

var (
	typePrefix  = regexp.MustCompile(`^\(([^)]+)\)\s*`)
	defaultLine = regexp.MustCompile(`^#\s*@default\s*--\s*(.*)$`)
)

// ParseValues reads the documented entries of a values.yaml, in file order. It fails on a key
// that lacks a description where one is required.
func ParseValues(path string) ([]Value, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read values: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a YAML mapping", path)
	}
	var (
		out  []Value
		errs []error
	)
	var walk func(m *yaml.Node, prefix string)
	walk = func(m *yaml.Node, prefix string) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			key := k.Value
			if prefix != "" {
				key = prefix + "." + k.Value
			}
			val, ok, err := describe(k, v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %s: %w", path, k.Line, key, err))
				continue
			}
			if !ok {
				errs = append(errs, fmt.Errorf(`%s:%d: %s has no "# --" description`, path, k.Line, key))
				continue
			}
			val.Key = key
			val.Depth = strings.Count(key, ".")
			val.Section = isSection(v)
			if val.Section {
				val.Default = "" // its children show theirs
			}
			out = append(out, val)
			if val.Section {
				walk(v, key)
			}
		}
	}
	walk(doc.Content[0], "")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// isSection tells whether a mapping's children are documented one by one (any of them carries a
// "# --" comment).
func isSection(v *yaml.Node) bool {
	if v.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i < len(v.Content); i += 2 {
		if _, ok, _ := description(v.Content[i].HeadComment); ok {
			return true
		}
	}
	return false
}

// describe reads the description of key k with value v; ok is false when there is none.
func describe(k, v *yaml.Node) (Value, bool, error) {
	desc, ok, def := description(k.HeadComment)
	if !ok {
		return Value{}, false, nil
	}
	val := Value{Description: desc}
	if m := typePrefix.FindStringSubmatch(desc); m != nil {
		val.Type = m[1]
		val.Description = strings.TrimSpace(desc[len(m[0]):])
	} else {
		val.Type = nodeType(v)
	}
	if val.Description == "" {
		return Value{}, false, errors.New("empty description")
	}
	if def != "" {
		val.Default = def
	} else {
		var x any
		if err := v.Decode(&x); err != nil {
			return Value{}, false, fmt.Errorf("decode default: %w", err)
		}
		j, err := json.Marshal(x)
		if err != nil {
			return Value{}, false, fmt.Errorf("encode default: %w", err)
		}
		val.Default = "`" + string(j) + "`"
	}
	return val, true, nil
}

// description extracts the "# --" description of a head comment, and the text of an
// "# @default --" line.
func description(head string) (desc string, ok bool, def string) {
	lines := strings.Split(head, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "# --") {
			start = i
		}
	}
	if start < 0 {
		return "", false, ""
	}
	var parts []string
	for i, l := range lines[start:] {
		l = strings.TrimSpace(l)
		if m := defaultLine.FindStringSubmatch(l); m != nil {
			def = m[1]
			continue
		}
		if i == 0 {
			l = strings.TrimPrefix(l, "# --")
		} else {
			l = strings.TrimPrefix(l, "#")
		}
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " "), true, def
}

func nodeType(v *yaml.Node) string {
	switch v.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return nodeType(v.Alias)
	case yaml.DocumentNode, yaml.ScalarNode: // named by their tag, below
	}
	switch v.Tag {
	case "!!str":
		return "string"
	case "!!int":
		return "int"
	case "!!bool":
		return "bool"
	case "!!float":
		return "float"
	case "!!null":
		return "null"
	}
	return v.Tag
}

// readmeData is what README.md.gotmpl is executed with.
type readmeData struct {
	Name, Description, Version, AppVersion string
	// General holds the top-level keys that are not sections.
	General []Value
	// Sections are the top-level sections, each with the rows of its table.
	Sections []readmeSection
}

type readmeSection struct {
	Value
	Rows []Value
}

// renderReadme executes the chart's README.md.gotmpl.
func renderReadme(chartDir string, values []Value) ([]byte, error) {
	var chart struct {
		Name        string `yaml:"name"`
		Description string `yaml:"description"`
		Version     string `yaml:"version"`
		AppVersion  string `yaml:"appVersion"`
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("read Chart.yaml: %w", err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		return nil, fmt.Errorf("parse Chart.yaml: %w", err)
	}
	data := readmeData{Name: chart.Name, Description: strings.TrimSpace(chart.Description), Version: chart.Version, AppVersion: chart.AppVersion}
	for _, v := range values {
		switch {
		case v.Depth == 0 && !v.Section:
			data.General = append(data.General, v)
			continue
		case v.Depth == 0:
			data.Sections = append(data.Sections, readmeSection{Value: v})
			continue
		}
		s := &data.Sections[len(data.Sections)-1]
		s.Rows = append(s.Rows, v)
	}
	tmpl, err := template.New("README.md.gotmpl").Funcs(template.FuncMap{
		"cell": func(s string) string {
			return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
		},
	}).ParseFiles(filepath.Join(chartDir, "README.md.gotmpl"))
	if err != nil {
		return nil, fmt.Errorf("parse README template: %w", err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, data); err != nil {
		return nil, fmt.Errorf("render README: %w", err)
	}
	return out.Bytes(), nil
}
