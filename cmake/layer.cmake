# vmmc_add_layer(<name> [PUBLIC <deps>...] [PRIVATE <deps>...])
# One shared library per layer, vmmc::<name>: sources are the layer's src/*.cc,
# public headers its include/ (vmmc/<name>/*.h), private ones its src/.
function(vmmc_add_layer name)
  cmake_parse_arguments(L "" "" "PUBLIC;PRIVATE" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cc)
  add_library(vmmc_${name} SHARED ${sources})
  add_library(vmmc::${name} ALIAS vmmc_${name})
  target_include_directories(vmmc_${name}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(vmmc_${name} PUBLIC ${L_PUBLIC} PRIVATE ${L_PRIVATE} vmmc::warnings)
  # Nobody interposes the layers' own functions: calls inside a layer are
  # direct (no PLT) and may be inlined, as in a static library.
  target_compile_options(vmmc_${name} PRIVATE -fno-semantic-interposition)
  target_link_options(vmmc_${name} PRIVATE -Wl,-Bsymbolic-functions)
endfunction()
