package helm_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDashboard checks docs/grafana/limiterd.json: a Grafana dashboard whose queries use only
// metrics that limiterd exports (read from limiterd/metrics), covering each of them, through
// the dashboard's data source variable.
func TestDashboard(t *testing.T) {
	t.Parallel()
	exported, histograms := exportedMetrics(t)
	t.Logf("limiterd exports %v (histograms %v)", keys(exported), keys(histograms))

	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "grafana", "limiterd.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID           string `json:"uid"`
		Title         string `json:"title"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource *struct {
				Type string `json:"type"`
				UID  string `json:"uid"`
			} `json:"datasource"`
			GridPos struct{ X, Y, W, H int } `json:"gridPos"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("docs/grafana/limiterd.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || dash.SchemaVersion < 30 {
		t.Errorf("uid %q title %q schemaVersion %d", dash.UID, dash.Title, dash.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["namespace"] != "query" || vars["policy"] != "query" {
		t.Errorf("template variables %v, want datasource, namespace and policy", vars)
	}

	metricRef := regexp.MustCompile(`\b(limiterd_[a-z0-9_]+)`)
	used := map[string]bool{}
	ids := map[int]bool{}
	queries := 0
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") || strings.Count(tg.Expr, "{") != strings.Count(tg.Expr, "}") {
				t.Errorf("panel %q: unbalanced query %q", p.Title, tg.Expr)
			}
			refs := metricRef.FindAllString(tg.Expr, -1)
			if len(refs) == 0 {
				t.Errorf("panel %q: query %q reads no limiterd metric", p.Title, tg.Expr)
			}
			for _, name := range refs {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && histograms[b] {
						base = b
					}
				}
				if !exported[base] {
					t.Errorf("panel %q: query reads %s, which limiterd does not export (it exports %v)", p.Title, name, keys(exported))
				}
				if histograms[base] && base == name {
					t.Errorf("panel %q: histogram %s read without _bucket, _sum or _count", p.Title, name)
				}
				used[base] = true
			}
			if strings.Contains(tg.Expr, "rate(") && !strings.Contains(tg.Expr, "$__rate_interval") {
				t.Errorf("panel %q: rate without $__rate_interval: %q", p.Title, tg.Expr)
			}
		}
	}
	for name := range exported {
		if !used[name] {
			t.Errorf("no panel shows %s", name)
		}
	}
	if queries < 10 {
		t.Errorf("only %d queries", queries)
	}
}

// exportedMetrics reads the names of limiterd's metrics from the Go files of limiterd/... and
// cmd/limiterd, and which of them are histograms.
func exportedMetrics(t testing.TB) (names, histograms map[string]bool) {
	t.Helper()
	var files []string
	for _, dir := range []string{"limiterd", filepath.Join("cmd", "limiterd")} {
		err := filepath.WalkDir(filepath.Join(repoRoot(t), dir), func(path string, _ fs.DirEntry, err error) error {
			if strings.HasSuffix(path, ".go") {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	names, histograms = map[string]bool{}, map[string]bool{}
	// A metric is declared as prometheus.New<Kind>[Vec|Func](prometheus.<Kind>Opts{ Name: "..." }).
	decl := regexp.MustCompile(`(?s)prometheus\.New(Counter|Gauge|Histogram|Summary)(?:Vec|Func)?\(\s*prometheus\.\w+Opts\{\s*Name:\s*"(limiterd_[a-z0-9_]+)"`)
	// A collector's metric is described as prometheus.NewDesc("...", (never a histogram here).
	desc := regexp.MustCompile(`prometheus\.NewDesc\(\s*"(limiterd_[a-z0-9_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			names[m[2]] = true
			if m[1] == "Histogram" {
				histograms[m[2]] = true
			}
		}
		for _, m := range desc.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
	}
	for _, want := range []string{"limiterd_decisions_total", "limiterd_tracked_clients", "limiterd_leases_held"} {
		if !names[want] {
			t.Fatalf("found no declaration of %s in limiterd/metrics (found %v): update exportedMetrics", want, keys(names))
		}
	}
	if len(histograms) == 0 {
		t.Fatalf("found no histogram in limiterd/metrics")
	}
	return names, histograms
}
