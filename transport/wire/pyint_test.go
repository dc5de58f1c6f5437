package wire

import (
	"errors"
	"math"
	"testing"
)

func TestParsePyInt(t *testing.T) {
	ok := map[string]int64{
		"0": 0, "42": 42, " 42 ": 42, "+7": 7, "-7": -7, "1_000": 1000, "0042": 42,
		"\t5\n": 5, "\v\f\r9": 9,
		"9223372036854775807":  math.MaxInt64,
		"-9223372036854775808": math.MinInt64,
	}
	for in, want := range ok {
		got, err := ParsePyInt([]byte(in))
		if err != nil || got != want {
			t.Errorf("ParsePyInt(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]error{
		"":                           errIntEmpty,
		" ":                          errIntSyntax,
		"+":                          errIntSyntax,
		"1__0":                       errIntSyntax,
		"_1":                         errIntSyntax,
		"1_":                         errIntSyntax,
		"0x10":                       errIntSyntax,
		"4.0":                        errIntSyntax,
		"None":                       errIntSyntax,
		"1 2":                        errIntSyntax,
		"\xd9\xa3":                   errIntSyntax, // non-ASCII digit: ascii decode fails upstream
		"--1":                        errIntSyntax,
		"\x1c5":                      errIntSyntax, // str.isspace() is true, but int() does not strip it
		"9223372036854775808":        errIntRange,
		"-9223372036854775809":       errIntRange,
		"99999999999999999999999999": errIntRange,
	}
	for in, want := range bad {
		if _, err := ParsePyInt([]byte(in)); !errors.Is(err, want) {
			t.Errorf("ParsePyInt(%q) error = %v; want %v", in, err, want)
		}
	}
}
