package redis

import (
	"crypto/sha1" //nolint:gosec // Redis names scripts by their SHA-1
	_ "embed"
	"encoding/hex"
	"regexp"
	"strings"

	"github.com/redis/rueidis"
)

// The decision script is put together here, once: the library of the algorithms
// (algorithms.lua) and the entry script (decide.lua), with each name of the protocol replaced
// by its value (protocolNames, from protocol.go). Redis runs one script per EVALSHA, with no
// require: each piece is embedded, and the pieces are joined.
//
// Redis runs the script's body on every call: it makes each of the script's functions anew and
// binds each to the locals it reads, at a cost that grows with the locals the script defines and
// the functions capture (Lua's open upvalues are a list, searched for each one bound). So the
// protocol's names become literals (constants of the compiled script, which cost nothing a
// call), and a call runs the script joined with the library sections it may run only: those of
// its limits' algorithms, and the sections of conversions and refunds only when it refunds or
// carries a conversion (scripts.of). The entry script calls no function of a section its script
// lacks (an undefined name is an error only when it runs).
//
// The most common call, a decision on one token bucket, makes only the functions it calls: the
// token bucket's decision section comes first, then the entry script's head (up to its line
// entrySplit), which decides such a call and returns, then the other sections, then the rest of
// the entry script. A function is made when the script's body reaches it.
var (
	//go:embed algorithms.lua
	algorithmsSource string
	//go:embed decide.lua
	decideEntry string
	//go:embed reset.lua
	resetSource string
	//go:embed resetscan.lua
	resetScanSource string

	decideScripts   = joinScripts(algorithmsSource, entryHead(decideEntry))
	resetScript     = newScript(resetSource)
	resetScanScript = newScript(resetScanSource)
)

// library is a release's decision scripts: those of Decide and DecideBatch, and those of Refund
// (onceScripts). A Store runs this release's, currentLibrary; the tests run the previous
// release's beside it on one Redis, as the replicas of both run during a rolling upgrade, on
// states that either wrote.
type library struct{ decide, once *scripts }

var currentLibrary = library{decide: decideScripts, once: onceScripts}

// algorithms is the set of algorithms whose section of the library a script holds.
type algorithms uint8

const (
	withTokenBucket algorithms = 1 << iota
	withSlidingWindow
	withQuota
	withConcurrency
	withAll = withTokenBucket | withSlidingWindow | withQuota | withConcurrency
)

// The lines that start the library's sections, in their order: before the first, what every
// algorithm uses. Each algorithm has a section that every call of it needs, and one of what only
// a call that refunds or carries a conversion runs (a full script). A first section goes before
// the entry script's head, the others after it.
var sections = [...]struct {
	start string
	of    algorithms
	full  bool
	first bool
}{
	{"\n-- Token buckets. ", withTokenBucket, false, true},
	{"\n-- Sliding-window logs read by the other algorithms.", withTokenBucket | withQuota | withConcurrency, false, false},
	{"\n-- Token buckets: a limit of the general way", withTokenBucket, false, false},
	{"\n-- Token buckets: conversions and refunds", withTokenBucket, true, false},
	{"\n-- Sliding windows. ", withSlidingWindow, false, false},
	{"\n-- Sliding windows: conversions and refunds", withSlidingWindow, true, false},
	{"\n-- Quotas. ", withQuota, false, false},
	{"\n-- Quotas: conversions and refunds", withQuota, true, false},
	{"\n-- Concurrency limits. ", withConcurrency, false, false},
}

// script is the decision script of one set of algorithms.
type script struct {
	source string
	lua    *rueidis.Lua
	sha    string // the SHA-1 digest EVALSHA names it by
}

// scripts are the decision scripts of one entry: by set of algorithms, lean (0: the sections
// that every call needs) or full (1: all the sections of the set).
type scripts [withAll + 1][2]script

// of returns the script of a call: of its limits' algorithms, full when it refunds or carries
// a conversion.
func (s *scripts) of(c *call) *script {
	if c.mode == modeRefund || c.mode == modeRelease || c.mode == modeExtend || c.converts != nil {
		return &s[c.algorithms][1]
	}
	return &s[c.algorithms][0]
}

// entrySplit is the line of decide.lua that ends its head: what follows needs the library's
// sections that are not first, which Go joins after it.
const entrySplit = "\n-- The general way, after the rest of the library (Go joins it here: script.go).\n"

// entry is an entry script cut in two: its head, joined before the library's sections that are
// not first, and the rest, joined after them.
type entry struct{ head, rest string }

// entryHead returns the entry script source cut after its line entrySplit.
func entryHead(source string) entry {
	head, rest, ok := strings.Cut(source, entrySplit)
	if !ok {
		panic("decide.lua: no line " + strings.TrimSpace(entrySplit))
	}
	return entry{head + entrySplit, rest}
}

// joinScripts returns the scripts of the library source lib (algorithms.lua's) whose entry is
// e: for each set of algorithms, lean and full, the library's first sections, e's head, the
// other sections, then e's rest, each protocol name replaced by its value.
func joinScripts(lib string, e entry) *scripts {
	var parts [len(sections) + 1]string // what every algorithm uses, then each section
	rest := lib
	for i, sec := range sections {
		before, after, ok := strings.Cut(rest, sec.start)
		if !ok {
			panic("algorithms.lua: no section " + strings.TrimSpace(sec.start) + " after the previous one")
		}
		parts[i], rest = before, sec.start+after
	}
	parts[len(sections)] = rest
	var all scripts
	for set := withTokenBucket; set <= withAll; set++ {
		for full := range 2 {
			first, after := parts[0], ""
			for i, sec := range sections {
				switch {
				case set&sec.of == 0 || full == 0 && sec.full:
				case sec.first:
					first += parts[i+1]
				default:
					after += parts[i+1]
				}
			}
			src := withProtocol(first + "\n" + e.head + after + "\n" + e.rest)
			all[set][full] = newScript(src)
		}
	}
	return &all
}

// allScripts returns every script the store runs: the reset scripts, and for each set of
// algorithms the decision scripts, lean and full, and the refund script (onceScripts, always
// full).
func allScripts() []*script {
	all := []*script{&resetScript, &resetScanScript}
	for set := withTokenBucket; set <= withAll; set++ {
		all = append(all, &decideScripts[set][0], &decideScripts[set][1], &onceScripts[set][1])
	}
	return all
}

// protocolName is a name the protocol may define (protocolNames): a word in capitals.
var protocolName = regexp.MustCompile(`\b[A-Z][A-Z0-9_]*\b`)

// withProtocol returns source with each protocol name outside its comments replaced by its value.
// A script's comments hold no string delimiter, and its strings no "--".
func withProtocol(source string) string {
	names := protocolNames()
	lines := strings.SplitAfter(source, "\n")
	for i, line := range lines {
		code, comment, found := strings.Cut(line, "--")
		code = protocolName.ReplaceAllStringFunc(code, func(name string) string {
			if v, ok := names[name]; ok {
				return v
			}
			return name
		})
		if found {
			code += "--" + comment
		}
		lines[i] = code
	}
	return strings.Join(lines, "")
}

// newScript returns the script of source.
func newScript(source string) script {
	return script{source: source, lua: rueidis.NewLuaScript(source), sha: scriptSHA(source)}
}

// scriptSHA returns the SHA-1 digest that EVALSHA names a script by.
func scriptSHA(source string) string {
	sum := sha1.Sum([]byte(source)) //nolint:gosec // not for security: the script's name in Redis
	return hex.EncodeToString(sum[:])
}
