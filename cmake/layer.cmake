# vmmc_add_layer(<name> [HEADERS_TO <dir>] [PUBLIC <deps>...] [PRIVATE <deps>...])
# One shared library per layer, vmmc::<name>: sources are the layer's src/*.cc,
# public headers its include/ (vmmc/<name>/*.h), private ones its src/.
# Installed as lib/<arch>/libvmmc_<name>.so.<version> with its soname link,
# in the export set that find_package(vmmc) loads; the layer's include/
# goes to HEADERS_TO (default: the include directory), which consumers of
# the installed target get on their include path.
function(vmmc_add_layer name)
  cmake_parse_arguments(L "" "HEADERS_TO" "PUBLIC;PRIVATE" ${ARGN})
  if(NOT L_HEADERS_TO)
    set(L_HEADERS_TO ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cc)
  add_library(vmmc_${name} SHARED ${sources})
  add_library(vmmc::${name} ALIAS vmmc_${name})
  set_target_properties(vmmc_${name} PROPERTIES
    EXPORT_NAME ${name}
    VERSION ${PROJECT_VERSION} SOVERSION ${VMMC_SOVERSION}
    INSTALL_RPATH "$ORIGIN"  # the other layers, wherever the prefix is
    # Only the public headers' declarations are exported (they push default
    # visibility); everything in src/ stays inside the library.
    CXX_VISIBILITY_PRESET hidden C_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(vmmc_${name}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${L_HEADERS_TO}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(vmmc_${name} PUBLIC ${L_PUBLIC} PRIVATE ${L_PRIVATE} vmmc::warnings)
  # Nobody interposes the layers' own functions: calls inside a layer are
  # direct (no PLT) and may be inlined, as in a static library.
  target_compile_options(vmmc_${name} PRIVATE -fno-semantic-interposition)
  target_link_options(vmmc_${name} PRIVATE -Wl,-Bsymbolic-functions)
  install(TARGETS vmmc_${name} EXPORT vmmc-targets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  # The whole folder: headers, and whatever else a layer ships for its users
  # to include (nx's Fortran include files).
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${L_HEADERS_TO})
endfunction()
