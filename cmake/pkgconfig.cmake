# vmmc_install_pkgconfig(<layer> DESCRIPTION <text> [REQUIRES <modules>...]
#                        [CFLAGS <flags>...] [LIBS <flags>...])
# Installs lib/<arch>/pkgconfig/vmmc-<layer>.pc (template: vmmc.pc.in). Its
# prefix is the one the install runs with (`cmake --install --prefix P`, or
# /usr in the .deb), so the file is written at install time: everything else
# is filled in now. CFLAGS default to -I${includedir}.
set(vmmc_pc_template ${CMAKE_CURRENT_LIST_DIR}/vmmc.pc.in)
function(vmmc_install_pkgconfig layer)
  cmake_parse_arguments(PC "" "DESCRIPTION" "REQUIRES;CFLAGS;LIBS" ${ARGN})
  set(pc_layer ${layer})
  set(pc_description ${PC_DESCRIPTION})
  list(JOIN PC_REQUIRES ", " pc_requires)
  if(pc_requires)
    set(pc_requires "\nRequires: ${pc_requires}")
  endif()
  if(NOT PC_CFLAGS)
    set(PC_CFLAGS "-I\${includedir}")
  endif()
  list(JOIN PC_CFLAGS " " pc_cflags)
  list(JOIN PC_LIBS " " pc_libs)
  if(pc_libs)
    set(pc_libs " ${pc_libs}")
  endif()
  set(prefix "@prefix@")  # left for install time
  set(partial ${CMAKE_CURRENT_BINARY_DIR}/vmmc-${layer}.pc.in)
  configure_file(${vmmc_pc_template} ${partial} @ONLY)
  # Written to a folder of its own per destination: installs to two
  # prefixes may run at once (the install and package tests do).
  install(CODE "set(prefix \"\${CMAKE_INSTALL_PREFIX}\")
    string(MD5 where \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
    set(dir \"${CMAKE_CURRENT_BINARY_DIR}/pkgconfig-\${where}\")
    configure_file(\"${partial}\" \"\${dir}/vmmc-${layer}.pc\" @ONLY)
    file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig\"
         TYPE FILE FILES \"\${dir}/vmmc-${layer}.pc\")
    file(REMOVE_RECURSE \"\${dir}\")")
endfunction()
