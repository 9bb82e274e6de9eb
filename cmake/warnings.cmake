# Warnings as a private interface target: every project target links it
# PRIVATE, so consumers of our libraries never inherit our flags.
add_library(vmmc_warnings INTERFACE)
add_library(vmmc::warnings ALIAS vmmc_warnings)
target_compile_options(vmmc_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
  -Wcast-align -Wunused -Woverloaded-virtual -Wconversion -Wno-sign-conversion
  -Werror=return-type -Werror=format-security)
if(VMMC_SANITIZE STREQUAL "address")
  set(vmmc_sanitizer_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined)
elseif(VMMC_SANITIZE STREQUAL "thread")
  # -Wno-tsan: GCC warns at every inlined std::atomic_thread_fence that TSan
  # cannot model fences; ours order atomics only, never plain data.
  set(vmmc_sanitizer_flags -fsanitize=thread)
  set(vmmc_sanitizer_warnings -Wno-tsan)
elseif(VMMC_SANITIZE)
  message(FATAL_ERROR "VMMC_SANITIZE must be address, thread or empty, not '${VMMC_SANITIZE}'")
endif()
# Sanitizers apply to every target we build, C examples and rpcgen output
# included: an uninstrumented program linked to an instrumented layer would
# load the sanitizer runtime too late.
if(vmmc_sanitizer_flags)
  add_compile_options(${vmmc_sanitizer_flags} ${vmmc_sanitizer_warnings} -fno-omit-frame-pointer)
  add_link_options(${vmmc_sanitizer_flags})
endif()
# TSan cannot see std::timed_mutex's locks, nor tell a fork() child's new
# threads from its parent's, without these shims (see the files); every
# target of the thread build links them (tests preload them, too).
if(VMMC_SANITIZE STREQUAL "thread")
  add_library(vmmc_tsan_clocklock SHARED ${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_clocklock.c
                                         ${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_fork.c)
  # A build-only dependency: the installed package (cmake/package.cmake)
  # must not ask its users for it.
  link_libraries($<BUILD_INTERFACE:vmmc_tsan_clocklock>)
endif()
