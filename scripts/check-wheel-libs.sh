#!/usr/bin/env bash
# Checks that a kvxferd binary runs where a manylinux wheel may be installed:
#   scripts/check-wheel-libs.sh KVXFERD [MAX_GLIBC]
# MAX_GLIBC (default $KVXFER_WHEEL_GLIBC, else 2.34) is the glibc of the wheel's
# manylinux_X_Y tag. Prints ldd's output, then fails (exit 1) when
#   * a library ldd lists is outside the manylinux (PEP 599/600) core set, or
#     one is not found (a system libzmq would show up here);
#   * a GLIBC_x.y symbol version is newer than MAX_GLIBC (or GLIBC_PRIVATE):
#     pip would install the wheel on a system whose loader then refuses it.
# Stricter than the policy in one point: libstdc++.so.6 is in the manylinux set
# but is rejected here, since its GLIBCXX versions would depend on the
# target's compiler runtime; the wheel links it statically instead.
set -euo pipefail

bin="${1:?usage: $0 KVXFERD [MAX_GLIBC]}"
max="${2:-${KVXFER_WHEEL_GLIBC:-2.34}}"
[ -x "$bin" ] || { echo "check-wheel-libs: $bin: not an executable" >&2; exit 1; }
command -v objdump >/dev/null || { echo "check-wheel-libs: objdump missing (apt-get install binutils)" >&2; exit 1; }

# glibc's own libraries, the vDSO and libgcc_s: what every manylinux system has.
allowed=" linux-vdso.so.1 linux-gate.so.1 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1
	libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1 "

fail=0
echo "ldd $bin:"
out="$(ldd "$bin" 2>&1)" || { echo "$out"; echo "check-wheel-libs: ldd failed" >&2; exit 1; }
echo "$out"
while read -r lib rest; do
	[ -n "$lib" ] || continue
	name="$(basename "$lib")"
	case "$rest" in *"not found"*)
		echo "check-wheel-libs: FAIL: $name not found" >&2; fail=1; continue;;
	esac
	case "$allowed" in *[[:space:]]"$name"[[:space:]]*) continue;; esac
	if [ "$name" = libstdc++.so.6 ]; then
		echo "check-wheel-libs: FAIL: libstdc++.so.6 is linked dynamically (link it statically: -Wl,-Bstatic -lstdc++)" >&2
	else
		echo "check-wheel-libs: FAIL: $name is outside the manylinux set: the wheel's kvxferd must not need it" >&2
	fi
	fail=1
done <<<"$out"

# Symbol versions of the references into glibc (ld.so's and libc's).
vers="$(objdump -T "$bin" | grep -o '(GLIBC_[A-Z0-9_.]*)' | tr -d '()' | sort -u -V)"
if grep -q GLIBC_PRIVATE <<<"$vers"; then
	echo "check-wheel-libs: FAIL: references GLIBC_PRIVATE symbols" >&2; fail=1
fi
need="$(grep -v PRIVATE <<<"$vers" | sed 's/^GLIBC_//' | sort -V | tail -n1)"
echo "GLIBC symbol versions: $(tr '\n' ' ' <<<"$vers")"
echo "newest GLIBC needed: ${need:-none}; the tag allows $max"
if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$max" | sort -V | tail -n1)" != "$max" ]; then
	echo "check-wheel-libs: FAIL: needs GLIBC_$need, newer than the tag's $max; these symbols:" >&2
	objdump -T "$bin" | grep -o '(GLIBC_[0-9.]*).*' | awk -v max="$max" '{
		v = $1; gsub(/[()]|GLIBC_/, "", v); split(v, a, "."); split(max, b, ".")
		if (a[1] > b[1] || (a[1] == b[1] && a[2] + 0 > b[2] + 0)) print "  " $0 }' >&2
	fail=1
fi
if objdump -T "$bin" | grep -q '(GLIBCXX_\|(CXXABI_'; then
	echo "check-wheel-libs: FAIL: references libstdc++ symbol versions (GLIBCXX/CXXABI)" >&2; fail=1
fi

if [ "$fail" -ne 0 ]; then
	echo "check-wheel-libs: $bin is not fit for a manylinux_${max/./_} wheel" >&2
	exit 1
fi
echo "check-wheel-libs: OK: $bin needs only the manylinux core libraries and GLIBC <= $max"
