package wire

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// Upstream parses every ASCII number with Python's int(frame.decode("ascii")). We accept
// exactly that grammar (surrounding whitespace, an optional sign, underscores between
// digits, leading zeros) so that anything an upstream prefill would accept, we accept too,
// but we bound the value to int64 (Python ints are unbounded): no field of the protocol can
// legitimately exceed it (rooms are < 2^63).

var (
	errIntEmpty    = errors.New("empty integer literal")
	errIntSyntax   = errors.New("invalid integer literal")
	errIntRange    = errors.New("integer out of range")
	errNotASCII    = errors.New("not ASCII")
	errNotUTF8     = errors.New("not valid UTF-8")
	errIntNegative = errors.New("negative value not allowed")
)

// pySpace reports the characters Python's int() strips around a literal: ASCII whitespace
// " \t\n\v\f\r" (unlike str.isspace, not the separators 0x1c-0x1f; checked on CPython 3.11).
func pySpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r')
}

// ParsePyInt parses b as Python's int(b.decode("ascii")) would, limited to int64.
func ParsePyInt(b []byte) (int64, error) {
	i, j := 0, len(b)
	for i < j && pySpace(b[i]) {
		i++
	}
	for j > i && pySpace(b[j-1]) {
		j--
	}
	if i == j {
		if len(b) == 0 {
			return 0, errIntEmpty
		}
		return 0, fmt.Errorf("%w %q", errIntSyntax, clip(b))
	}
	neg := false
	if b[i] == '+' || b[i] == '-' {
		neg = b[i] == '-'
		i++
	}
	if i == j {
		return 0, fmt.Errorf("%w %q", errIntSyntax, clip(b))
	}
	var v uint64
	prevDigit := false
	for k := i; k < j; k++ {
		c := b[k]
		switch {
		case c >= '0' && c <= '9':
			d := uint64(c - '0')
			if v > (math.MaxUint64-d)/10 {
				return 0, fmt.Errorf("%w: %q", errIntRange, clip(b))
			}
			v = v*10 + d
			prevDigit = true
		case c == '_' && prevDigit && k+1 < j && b[k+1] >= '0' && b[k+1] <= '9':
			prevDigit = false
		default:
			return 0, fmt.Errorf("%w %q", errIntSyntax, clip(b))
		}
	}
	if neg {
		if v > 1<<63 {
			return 0, fmt.Errorf("%w: %q", errIntRange, clip(b))
		}
		return -int64(v), nil //nolint:gosec // v <= 2^63 checked above; -2^63 wraps correctly
	}
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %q", errIntRange, clip(b))
	}
	return int64(v), nil
}

// asciiString is Python's b.decode("ascii").
func asciiString(b []byte) (string, error) {
	for _, c := range b {
		if c >= 0x80 {
			return "", errNotASCII
		}
	}
	return string(b), nil
}

// utf8String is Python's b.decode("utf-8") (strict).
func utf8String(b []byte) (string, error) {
	if !utf8.Valid(b) {
		return "", errNotUTF8
	}
	return string(b), nil
}

// clip bounds how much of a bad frame ends up in an error message.
func clip(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}
