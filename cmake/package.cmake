# `cpack -G DEB` in the build folder: vmmc_<version>_<arch>.deb, one package
# with the libraries, headers, interposer modules, tools and man pages, laid
# out as Debian does (/usr/lib/<multiarch>, /usr/include, /usr/bin).
set(CPACK_PACKAGE_NAME vmmc)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "vmmc developers <vmmc@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "virtual memory-mapped communication on libfabric: sockets, vRPC and NX")
set(CPACK_PACKAGE_DESCRIPTION
    "Processes export memory and send bytes straight into each other's; stream sockets, \
a SunRPC-compatible RPC layer and NX message passing are built on it. vmmc-run runs \
unmodified socket programs over it (LD_PRELOAD).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# The install runs with prefix /usr into a staging folder (DESTDIR), so the
# pkg-config files written at install time say /usr.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # Debian's packages carry no debug information
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# Depends: what dpkg-shlibdeps finds the binaries linked to (libc6,
# libstdc++6, libtirpc3, libpmix2 ...), plus libfabric, which core loads
# with dlopen when a context opens a provider, so no binary names it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Our own libraries, in the staging folder dpkg-shlibdeps runs in.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS usr/${CMAKE_INSTALL_LIBDIR})
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libfabric1 (>= ${LIBFABRIC_VERSION})")
# Building against it: vRPC's headers include libtirpc's, nxcc runs a compiler.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libtirpc-dev, gcc | c-compiler, pkg-config")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)  # a shlibs file, and the ldconfig trigger
include(CPack)
