package redis

import (
	"regexp"
	"strings"
	"testing"
)

// TestScriptUsesOnlyProtocolNames fails when the decision scripts name a constant that neither
// the protocol (protocolNames, from protocol.go) nor the script itself defines, when the
// protocol defines one no script uses, and when a script reads an argument or builds a reply by
// position instead of by name.
func TestScriptUsesOnlyProtocolNames(t *testing.T) {
	protocol := protocolNames()
	comment := regexp.MustCompile(`--.*`)
	literal := regexp.MustCompile(`'[^']*'|"[^"]*"`)
	constant := regexp.MustCompile(`\b[A-Z][A-Z0-9_]*\b`)
	own := regexp.MustCompile(`local ([A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*)`)
	byName := regexp.MustCompile(`^((?:[a-z]\w*|ARGS) \+ )?[A-Z][A-Z0-9_]*$`)
	used := map[string]bool{}
	for _, s := range []struct{ name, source string }{
		{"algorithms.lua", algorithmsSource}, {"decide.lua", decideEntry}, {"Refund", onceEntry},
	} {
		code := literal.ReplaceAllString(comment.ReplaceAllString(s.source, ""), "''")
		locals := map[string]bool{"KEYS": true, "ARGV": true} // Redis's
		for _, m := range own.FindAllStringSubmatch(code, -1) {
			for name := range strings.SplitSeq(m[1], ", ") {
				if _, ok := protocol[name]; ok {
					t.Errorf("%s: defines %s, a name of the protocol", s.name, name)
				}
				locals[name] = true
			}
		}
		for _, name := range constant.FindAllString(code, -1) {
			used[name] = true
			if _, ok := protocol[name]; !ok && !locals[name] {
				t.Errorf("%s: %s is not in the protocol", s.name, name)
			}
		}
		for _, m := range regexp.MustCompile(`ARGV\[([^\]]*)\]`).FindAllStringSubmatch(code, -1) {
			if !byName.MatchString(m[1]) { // ARGV[ARG_X], or ARGV[o + L_X] in a block that starts at o (ARGS: the first)
				t.Errorf("%s: reads an argument by position (%q), not by a protocol name", s.name, m[0])
			}
		}
		if m := regexp.MustCompile(`return \{[^\[}]`).FindString(code); m != "" {
			t.Errorf("%s: returns a reply by position (%q), not by REPLY_ names", s.name, m)
		}
		if m := regexp.MustCompile(`reply = \{[^0}]`).FindString(code); m != "" {
			t.Errorf("%s: makes a reply with values by position (%q), not by REPLY_ names", s.name, m)
		}
	}
	for name := range protocol {
		if !used[name] {
			t.Errorf("protocol: no script uses %s", name)
		}
	}
	// The scripts Redis runs name no constant of the protocol: each is replaced by its value.
	for set := withTokenBucket; set <= withAll; set++ {
		for _, sc := range []script{decideScripts[set][0], decideScripts[set][1], onceScripts[set][0], onceScripts[set][1]} {
			code := literal.ReplaceAllString(comment.ReplaceAllString(sc.source, ""), "''")
			for _, name := range constant.FindAllString(code, -1) {
				if _, ok := protocol[name]; ok {
					t.Errorf("script of set %d: %s is not replaced by its value", set, name)
				}
			}
		}
	}
}
