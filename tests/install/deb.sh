#!/usr/bin/env bash
# install.deb: `cpack -G DEB` makes vmmc_<version>_<arch>.deb; dpkg-deb shows
# a package whose dependencies are Debian packages (each installed here, at a
# version that satisfies it: this machine is the Debian 12 the build used),
# whose files sit where Debian keeps them, with pkg-config files that say
# /usr; unpacked into a throwaway root (dpkg -x, never into this system), its
# tools run and list every setting.
#   deb.sh <build dir> <source dir>
set -euo pipefail
build=$(readlink -f "$1")
source_dir=$(readlink -f "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
cd "$work"

(cd "$build" && cpack -G DEB -B "$work" >"$work/cpack.log" 2>&1) || {
  cat cpack.log
  fail "cpack -G DEB failed"
}
debs=(vmmc_*_"$(dpkg --print-architecture)".deb)
[[ -f ${debs[0]} ]] || fail "no vmmc_*.deb in $(ls)"
deb=${debs[0]}
echo "== $deb"
dpkg-deb --info "$deb"
[[ $(dpkg-deb --field "$deb" Package) == vmmc ]] || fail "the package is not named vmmc"

# Depends: every entry a Debian package installed here, its version in range.
depends=$(dpkg-deb --field "$deb" Depends)
IFS=, read -ra entries <<<"$depends"
names=" "
for entry in "${entries[@]}"; do
  read -r name relation version <<<"$(tr -d '()' <<<"$entry")"
  names+="$name "
  installed=$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' "$name" 2>/dev/null) || true
  [[ $installed == "ii "* ]] || fail "Depends names $name, which is no Debian package installed here"
  installed=${installed#ii }
  if [[ -n ${relation:-} ]]; then
    dpkg --compare-versions "$installed" "$relation" "$version" ||
      fail "$name $installed does not satisfy ($relation $version)"
  fi
done
for wanted in libfabric1 libtirpc3 libpmix2 libc6; do
  [[ $names == *" $wanted "* ]] || fail "Depends does not name $wanted: $depends"
done

echo "== contents"
dpkg-deb --contents "$deb" | awk '{print $6}' | sed 's|^\./||' | sort >contents.txt
cat contents.txt
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
lib=usr/lib/$arch
grep -v -e '^usr/' -e '^$' contents.txt && fail "files outside /usr"
for f in usr/bin/vmmc-run usr/bin/vmmc-settings usr/bin/nxrun usr/bin/nxcc usr/bin/nxf77 \
  usr/include/vmmc/core/context.h usr/include/vmmc/nx/nx.h usr/include/vmmc/vrpc/vrpc.h \
  $lib/vmmc/libvmmc_preload.so $lib/vmmc/libvmmc_preload_engine.so $lib/vmmc/libvrpc_preload.so \
  $lib/vmmc/libvrpc_preload_engine.so \
  $lib/cmake/vmmc/vmmc-config.cmake \
  $lib/pkgconfig/vmmc-core.pc $lib/pkgconfig/vmmc-sockets.pc $lib/pkgconfig/vmmc-vrpc.pc \
  $lib/pkgconfig/vmmc-nx.pc usr/share/man/man1/vmmc-run.1 usr/share/man/man1/vmmc-settings.1 \
  usr/share/man/man1/nxrun.1 usr/share/man/man1/nxcc.1; do
  grep -qx "$f" contents.txt || fail "not in the package: /$f"
done
for layer in core redirect sockets vrpc nx; do
  grep -qE "^$lib/libvmmc_$layer\.so\.[0-9.]+$" contents.txt || fail "no versioned libvmmc_$layer.so"
done

echo "== unpacked into a throwaway root"
dpkg-deb -x "$deb" root
grep -qx "prefix=/usr" "root/$lib/pkgconfig/vmmc-nx.pc" || fail "vmmc-nx.pc: $(head -1 "root/$lib/pkgconfig/vmmc-nx.pc")"
readelf -S "root/$lib/libvmmc_core.so".* | grep -q debug_info && fail "libvmmc_core is not stripped"
declared=$(cat "$source_dir"/*/src/*.cc | grep -cE 'setting_type::[a-z]+,[[:space:]]*("|$)')
listed=$(root/usr/bin/vmmc-settings | grep -c '^VMMC_')
((listed == declared)) || fail "the packaged vmmc-settings lists $listed settings, not $declared"
got=$(root/usr/bin/vmmc-run printenv LD_PRELOAD)
[[ $got == "$work/root/$lib/vmmc/libvmmc_preload.so" ]] || fail "the packaged vmmc-run preloads '$got'"
echo "vmmc-settings: $listed settings; vmmc-run preloads $got"
