package redis

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// protocolLine is one constant of a script's protocol block: local NAME = value.
var protocolLine = regexp.MustCompile(`^local ([A-Z][A-Z0-9_]*) = ('[^']*'|[0-9]+)$`)

// scriptProtocol returns the constants of a script's protocol block, the locals between the
// "-- Protocol:" and "-- End of protocol." lines.
func scriptProtocol(t *testing.T, name, source string) map[string]string {
	t.Helper()
	_, rest, ok := strings.Cut(source, "\n-- Protocol:")
	block, _, ok2 := strings.Cut(rest, "\n-- End of protocol.\n")
	if !ok || !ok2 {
		t.Fatalf("%s: no protocol block", name)
	}
	got := map[string]string{}
	for _, line := range strings.Split(block, "\n")[1:] {
		m := protocolLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("%s: protocol line %q is not local NAME = value", name, line)
		}
		if _, dup := got[m[1]]; dup {
			t.Fatalf("%s: %s is defined twice", name, m[1])
		}
		got[m[1]] = m[2]
	}
	return got
}

// TestScriptsMirrorProtocol fails when a script's protocol block and the Go constants of
// protocol.go drift apart, and when a script reads an argument or builds a reply by position
// instead of by name.
func TestScriptsMirrorProtocol(t *testing.T) {
	index := func(i int) string { return strconv.Itoa(i + 1) } // Go 0-based, Lua 1-based
	count := strconv.Itoa
	value := strconv.Itoa
	text := func(m mode) string { return "'" + string(m) + "'" }
	for _, s := range []struct {
		name, source string
		want         map[string]string
	}{
		{"tokenbucket.lua", tokenBucketSource, map[string]string{
			"MODE_DECIDE": text(modeDecide), "MODE_PEEK": text(modePeek), "MODE_REFUND": text(modeRefund),
			"ARG_MODE": index(tbArgMode), "ARG_FINGERPRINT": index(tbArgFingerprint),
			"ARG_NOW_S": index(tbArgNowS), "ARG_NOW_N": index(tbArgNowN), "ARG_RATE": index(tbArgRate),
			"ARG_TAU_S": index(tbArgTauS), "ARG_TAU_N": index(tbArgTauN), "ARG_TAU_F": index(tbArgTauF),
			"ARG_COST_S": index(tbArgCostS), "ARG_COST_N": index(tbArgCostN), "ARG_COST_F": index(tbArgCostF),
			"ARG_SLACK_MS": index(tbArgSlackMS), "ARGS": count(tbArgs),
			"REPLY_OUTCOME": index(tbReplyOutcome), "REPLY_NOW_S": index(tbReplyNowS), "REPLY_NOW_N": index(tbReplyNowN),
			"REPLY_STATE": index(tbReplyState), "REPLY_TAT_S": index(tbReplyTATS), "REPLY_TAT_N": index(tbReplyTATN),
			"REPLY_TAT_F": index(tbReplyTATF), "REPLY_RAW": index(tbReplyRaw),
			"OUTCOME_REJECTED": value(tbRejected), "OUTCOME_ADMITTED": value(tbAdmitted), "OUTCOME_CONVERT": value(tbConvert),
			"OUTCOME_REFUNDED": value(tbRefunded),
			"STATE_FRESH":      value(tbStateFresh), "STATE_TAT": value(tbStateTAT), "STATE_RAW": value(tbStateRaw),
		}},
		{"slidingwindow.lua", slidingWindowSource, map[string]string{
			"MODE_DECIDE": text(modeDecide), "MODE_PEEK": text(modePeek), "MODE_REFUND": text(modeRefund),
			"ARG_MODE": index(swArgMode), "ARG_FINGERPRINT": index(swArgFingerprint),
			"ARG_NOW_S": index(swArgNowS), "ARG_NOW_N": index(swArgNowN),
			"ARG_LIMIT": index(swArgLimit), "ARG_WINDOW": index(swArgWindow), "ARG_COST": index(swArgCost),
			"ARG_SLACK_MS": index(swArgSlackMS), "ARG_REBASE": index(swArgRebase), "ARGS": count(swArgs),
			"REPLY_ADMITTED": index(swReplyAdmitted), "REPLY_REMAINING": index(swReplyRemaining),
			"REPLY_RESET_AFTER": index(swReplyResetAfter), "REPLY_RETRY_AFTER": index(swReplyRetryAfter),
			"REPLY_LEN": count(swReplyLen), "REJECTED": value(swRejected), "ADMITTED": value(swAdmitted),
		}},
		{"stack.lua", stackSource, map[string]string{
			"MODE_DECIDE": text(modeDecide), "MODE_PEEK": text(modePeek), "MODE_REFUND": text(modeRefund),
			"ALGORITHM_TOKEN_BUCKET": "'" + stTokenBucket + "'", "ALGORITHM_SLIDING_WINDOW": "'" + stSlidingWindow + "'",
			"ARG_MODE": index(stArgMode), "ARG_NOW_S": index(stArgNowS), "ARG_NOW_N": index(stArgNowN),
			"ARG_COST": index(stArgCost), "ARG_SLACK_MS": index(stArgSlackMS), "ARG_REBASE": index(stArgRebase),
			"ARG_LIMITS": index(stArgLimits), "ARGS": count(stArgs),
			"L_ALGORITHM": index(stLimitAlgorithm), "L_FINGERPRINT": index(stLimitFingerprint), "L_RATE": index(stLimitRate),
			"L_TAU_S": index(stLimitTauS), "L_TAU_N": index(stLimitTauN), "L_TAU_F": index(stLimitTauF),
			"L_COST_S": index(stLimitCostS), "L_COST_N": index(stLimitCostN), "L_COST_F": index(stLimitCostF),
			"L_LIMIT": index(stLimitLimit), "L_WINDOW": index(stLimitWindow), "L_CONVERT_FROM": index(stLimitConvertFrom),
			"L_CONVERT_S": index(stLimitConvertS), "L_CONVERT_N": index(stLimitConvertN), "L_CONVERT_F": index(stLimitConvertF),
			"LIMIT_ARGS":    count(stLimitArgs),
			"REPLY_OUTCOME": index(stReplyOutcome), "REPLY_NOW_S": index(stReplyNowS), "REPLY_NOW_N": index(stReplyNowN),
			"REPLY_LIMITS": index(stReplyLimits),
			"R_STATE":      index(stReplyState), "R_TAT_S": index(stReplyTATS), "R_TAT_N": index(stReplyTATN), "R_TAT_F": index(stReplyTATF),
			"R_RAW": index(stReplyRaw), "R_ADMITTED": index(stReplyAdmitted), "R_REMAINING": index(stReplyRemaining),
			"R_RESET_AFTER": index(stReplyResetAfter), "R_RETRY_AFTER": index(stReplyRetryAfter), "LIMIT_REPLY": count(stLimitReply),
			"OUTCOME_REJECTED": value(tbRejected), "OUTCOME_ADMITTED": value(tbAdmitted), "OUTCOME_CONVERT": value(tbConvert),
			"OUTCOME_REFUNDED": value(tbRefunded), "OUTCOME_PEEKED": value(stPeeked),
			"STATE_FRESH": value(tbStateFresh), "STATE_TAT": value(tbStateTAT), "STATE_RAW": value(tbStateRaw),
			"REJECTED": value(swRejected), "ADMITTED": value(swAdmitted),
		}},
		{"cas.lua", casSource, map[string]string{
			"ARG_READ": index(casArgRead), "ARG_WRITE": index(casArgWrite), "ARG_TTL_MS": index(casArgTTLMS),
			"ARGS": count(casArgs), "CHANGED": value(casChanged), "WRITTEN": value(casWritten),
		}},
	} {
		got := scriptProtocol(t, s.name, s.source)
		for name, want := range s.want {
			if v, ok := got[name]; !ok {
				t.Errorf("%s: protocol lacks %s (Go: %s)", s.name, name, want)
			} else if v != want {
				t.Errorf("%s: %s = %s, Go says %s", s.name, name, v, want)
			}
		}
		for name, v := range got {
			if _, ok := s.want[name]; !ok {
				t.Errorf("%s: protocol has %s = %s, which Go does not know", s.name, name, v)
			}
		}
		if m := regexp.MustCompile(`ARGV\[[^A]`).FindString(s.source); m != "" {
			t.Errorf("%s: reads an argument by position (%q), not by an ARG_ name", s.name, m)
		}
		if m := regexp.MustCompile(`return \{[^\[}]`).FindString(s.source); m != "" {
			t.Errorf("%s: returns a reply by position (%q), not by REPLY_ names", s.name, m)
		}
	}
}
