#!/usr/bin/env bash
# A static libzmq for the wheel's kvxferd, in $KVXFER_LIBZMQ (/opt/kvxfer-libzmq).
#
# Why: the wheel must run where SGLang runs, which has no system libzmq. Debian's
# own libzmq.a cannot be used for that: it is built with libsodium, OpenPGM, NORM,
# GSSAPI (krb5 has no .a), libbsd and NORM's protokit/libxml2/ICU, so a static
# link would still pull in shared libraries outside the manylinux set. kvxferd
# only needs tcp:// and ipc:// with no CURVE security, so this builds Debian's
# own libzmq source (the same release and patches as the libzmq5 that the normal,
# dynamic build links) with every optional dependency off: libzmq.a then needs
# only libstdc++ (linked statically too), libgcc_s and glibc.
#
# glibc symbol versions: Debian's libstdc++.a (gcc 12, built on glibc 2.36)
# references arc4random@GLIBC_2.36 (std::random_device, which libzmq never
# uses, pulled in through std::locale). That alone would stop kvxferd loading
# on glibc 2.34/2.35 (RHEL 9, Ubuntu 22.04: SGLang's usual base image), so a
# tiny shim (libkvxfer_glibcshim.a, on getrandom@GLIBC_2.25) takes that
# reference through -Wl,--wrap=arc4random. libgcc stays the shared
# libgcc_s.so.1 (in the manylinux set): the static libgcc_eh.a would add
# _dl_find_object@GLIBC_2.35.
#
# The source comes through apt (`apt-get source`, signature-checked against
# Debian's keyring) from a private deb-src list, so the system's apt sources are
# not touched. Idempotent: a stamp holding the build configuration skips the
# build when the cache already matches; the install is moved into place only
# when complete, so an interrupted run leaves no half-built cache.
#
# Progress and errors go to stderr. The Makefile's wheel target points
# PKG_CONFIG_PATH at $KVXFER_LIBZMQ/lib/pkgconfig.
set -euo pipefail

PREFIX="${KVXFER_LIBZMQ:-/opt/kvxfer-libzmq}"
# Bump when anything below changes, so that an old cache is rebuilt.
CONFIG="v3 static no-sodium no-curve no-bsd no-pgm no-norm no-drafts pic arc4random-shim"
STAMP="$PREFIX/.kvxfer-build"

if [ -f "$STAMP" ] && [ "$(head -n1 "$STAMP")" = "$CONFIG" ] &&
	[ -f "$PREFIX/lib/libzmq.a" ] && [ -f "$PREFIX/cache-key" ]; then
	exit 0
fi

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if [ ${#need[@]} -gt 0 ]; then
	echo "build-libzmq-static: installing ${need[*]}" >&2
	apt-get update >&2
	apt-get install -y --no-install-recommends "${need[@]}" >&2
fi

. /etc/os-release
CODENAME="${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}"
WORK="$(mktemp -d /tmp/kvxfer-libzmq.XXXXXX)"
STAGE="$PREFIX.tmp.$$"
trap 'rm -rf "$WORK" "$STAGE"' EXIT
# apt's and cmake's output goes to a log, shown (its end) only on failure.
LOG="$WORK/build.log"
quiet() { "$@" >>"$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; echo "build-libzmq-static: failed: $*" >&2; exit 1; }; }

# Debian's source index only, in a private apt state (the system's lists stay
# as they are). Security and point-release updates included, so that the
# newest patched source of this release is the one built.
KEY=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$WORK/sources.list" <<EOF
deb-src [signed-by=$KEY] http://deb.debian.org/debian $CODENAME main
deb-src [signed-by=$KEY] http://deb.debian.org/debian $CODENAME-updates main
deb-src [signed-by=$KEY] http://deb.debian.org/debian-security $CODENAME-security main
EOF
mkdir -p "$WORK/lists/partial" "$WORK/src"
APT=(apt-get -q -o "Dir::Etc::SourceList=$WORK/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$WORK/lists" -o APT::Sandbox::User=root)
echo "build-libzmq-static: fetching Debian's zeromq3 source ($CODENAME)" >&2
quiet "${APT[@]}" update
(cd "$WORK/src" && quiet "${APT[@]}" source zeromq3)
SRC="$(find "$WORK/src" -mindepth 1 -maxdepth 1 -type d -name 'zeromq3-*' | head -n1)"
[ -n "$SRC" ] || { echo "build-libzmq-static: apt-get source zeromq3 unpacked nothing" >&2; exit 1; }
DEBVER="$(sed -n 's/^Version: //p' "$WORK"/src/zeromq3_*.dsc | head -n1)"

echo "build-libzmq-static: building libzmq $DEBVER (static) into $PREFIX" >&2
rm -rf "$STAGE"
# PIC: Go may link kvxferd as a PIE (-buildmode=pie); harmless otherwise.
# -ffile-prefix-map: libzmq's asserts embed __FILE__; without the (random)
# work directory in them the archive is the same on every build, and so is
# the cache key below (no needless rebuild of the Go side).
MAP="-ffile-prefix-map=$WORK/="
quiet cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_C_FLAGS="$MAP" -DCMAKE_CXX_FLAGS="$MAP" \
	-DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib \
	-DCMAKE_POSITION_INDEPENDENT_CODE=ON \
	-DBUILD_SHARED=OFF -DBUILD_STATIC=ON -DBUILD_TESTS=OFF -DWITH_PERF_TOOL=OFF -DWITH_DOCS=OFF \
	-DENABLE_CPACK=OFF -DENABLE_DRAFTS=OFF \
	-DWITH_LIBSODIUM=OFF -DENABLE_CURVE=OFF -DWITH_LIBBSD=OFF \
	-DWITH_OPENPGM=OFF -DWITH_NORM=OFF -DWITH_VMCI=OFF
quiet cmake --build "$WORK/build" -j"$(nproc)"
quiet env DESTDIR="$STAGE" cmake --install "$WORK/build"
ST="$STAGE$PREFIX"

# The arc4random shim (see the top of this file).
cat >"$WORK/glibcshim.c" <<'EOF'
/* Takes libstdc++.a's reference to arc4random (GLIBC_2.36), through
   -Wl,--wrap=arc4random, so that kvxferd loads on older glibc. The same
   contract: never fails, cryptographic quality. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

uint32_t __wrap_arc4random(void) {
	uint32_t v;
	for (;;) {
		ssize_t n = getrandom(&v, sizeof v, 0);
		if (n == (ssize_t)sizeof v)
			return v;
		if (n < 0 && errno == EINTR)
			continue;
		break; /* ENOSYS: a kernel before 3.17 */
	}
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v)
		abort();
	close(fd);
	return v;
}
EOF
quiet cc -O2 -fPIC "$MAP" -c "$WORK/glibcshim.c" -o "$WORK/glibcshim.o"
quiet ar rcs "$ST/lib/libkvxfer_glibcshim.a" "$WORK/glibcshim.o"

# Our own libzmq.pc: cgo runs `pkg-config --libs` (never --static), so
# everything libzmq.a needs goes in Libs. libstdc++ is linked statically
# (-Bstatic) so that the target's libstdc++ (its GLIBCXX version) does not
# matter; glibc (pthread, rt) stays dynamic because kvxferd dlopens libnixl
# and libcuda at run time. The shim comes after libstdc++ so that the linker
# still looks for __wrap_arc4random once libstdc++'s random.o is pulled in.
cat >"$ST/lib/pkgconfig/libzmq.pc" <<EOF
# Written by kvxfer's scripts/build-libzmq-static.sh: static libzmq $DEBVER
# (Debian source, no sodium/curve/pgm/norm/gssapi/libbsd) for the wheel.
prefix=$PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: libzmq
Description: 0MQ c++ library (static, for the kvxfer wheel)
Version: ${DEBVER%%-*}
Libs: -L\${libdir} -lzmq -Wl,-Bstatic -lstdc++ -Wl,-Bdynamic -lkvxfer_glibcshim -Wl,--wrap=arc4random -lpthread -lrt
Cflags: -I\${includedir} -DZMQ_STATIC
EOF
# No shared object may sit next to the archive (the linker would prefer it).
if find "$ST/lib" -name 'libzmq.so*' | grep -q .; then
	echo "build-libzmq-static: a libzmq.so was built; refusing" >&2
	exit 1
fi
printf '%s\n%s\n' "$CONFIG" "zeromq3 $DEBVER" >"$ST/.kvxfer-build"
# cmd/go does not hash pkg-config's output into its build cache keys, so cgo
# packages compiled against the system's libzmq would be reused as they are;
# the Makefile puts this key in CGO_CFLAGS (which is hashed) to tell them apart.
cat "$ST"/lib/*.a "$ST/lib/pkgconfig/libzmq.pc" | sha256sum | cut -c1-16 >"$ST/cache-key"
rm -rf "$PREFIX"
mkdir -p "$(dirname "$PREFIX")"
mv "$ST" "$PREFIX"
echo "build-libzmq-static: done ($PREFIX)" >&2
