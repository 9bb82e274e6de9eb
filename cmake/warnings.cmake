# Warnings and sanitizers as a private interface target: every project target
# links it PRIVATE, so consumers of our libraries never inherit our flags.
add_library(vmmc_warnings INTERFACE)
add_library(vmmc::warnings ALIAS vmmc_warnings)
target_compile_options(vmmc_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
  -Wcast-align -Wunused -Woverloaded-virtual -Wconversion -Wno-sign-conversion
  -Werror=return-type -Werror=format-security)
if(VMMC_SANITIZE)
  target_compile_options(vmmc_warnings INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer)
  target_link_options(vmmc_warnings INTERFACE -fsanitize=address,undefined)
endif()
