package control

// validTraceparent checks a W3C Trace Context traceparent header value
// (https://www.w3.org/TR/trace-context/#traceparent-header): version 00 is
// "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", lowercase, ids not all
// zero. A higher version may append fields after the flags ("-..."), which a version-00
// parser must accept by reading the first four; version ff is invalid. An invalid
// value is not an error for open: the W3C rule is to ignore it and start a new trace,
// so the server drops it (and says so in the reply) instead of failing the room.
func validTraceparent(s string) bool {
	if len(s) < 55 {
		return false
	}
	if !lowerHex(s[0:2]) || s[0:2] == "ff" || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if !lowerHex(s[3:35]) || !lowerHex(s[36:52]) || !lowerHex(s[53:55]) {
		return false
	}
	if allZero(s[3:35]) || allZero(s[36:52]) {
		return false
	}
	if s[0:2] == "00" {
		return len(s) == 55
	}
	return len(s) == 55 || s[55] == '-'
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}
