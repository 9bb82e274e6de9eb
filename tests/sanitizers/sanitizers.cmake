# Sanitizer builds (-DVMMC_SANITIZE=address|thread): how every test runs.
#
# - vmmc_preload_list(<var> <module>): the LD_PRELOAD value that puts an
#   instrumented interposer into a program (ours or Debian's), with the
#   sanitizer runtime where that sanitizer needs it.
# - vmmc_sanitize_tests(): gives every test of a directory the sanitizer
#   options: suppressions from this folder, and a log_path, so a report in
#   any process a test starts (a forked child, an exec'd program, a preloaded
#   Debian program) lands in <build>/sanitizer-reports/ even when the test
#   never looks at that process's exit status. scripts/test.sh fails the run
#   when that folder is not empty afterwards.
set(vmmc_preload_runtime "")
set(VMMC_SANITIZER_REPORTS ${PROJECT_BINARY_DIR}/sanitizer-reports)
set(vmmc_sanitizer_dir ${CMAKE_CURRENT_LIST_DIR})
set(vmmc_tsan_time_scale 4)  # TSan's slowdown on our tests, rounded up
# ASan's on our own code: with fake stacks for use after return, a call of
# the interposer costs 10-24 us where it costs 1-4 (integration.preload.idle_wait,
# alternated with the raw system call). Work stretches by it, and CTest's
# timeouts with it (vmmc_sanitize_directory).
set(vmmc_asan_time_scale 2)
if(VMMC_SANITIZE STREQUAL "address")
  set(vmmc_runtime_name libasan.so)
elseif(VMMC_SANITIZE STREQUAL "thread")
  set(vmmc_runtime_name libtsan.so)
endif()
if(vmmc_runtime_name)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${vmmc_runtime_name}
                  OUTPUT_VARIABLE vmmc_runtime OUTPUT_STRIP_TRAILING_WHITESPACE)
  get_filename_component(vmmc_runtime ${vmmc_runtime} REALPATH)
  set(vmmc_preload_runtime "${vmmc_runtime}")
  if(TARGET vmmc_tsan_clocklock)
    string(APPEND vmmc_preload_runtime ":$<TARGET_FILE:vmmc_tsan_clocklock>")
  endif()
endif()

# ASan: its runtime first, as it requires. TSan: the module first, so that
# the program's poll/select/epoll_wait/accept reach our interposer before
# TSan's interceptor: a blocking interceptor runs the function it wraps with
# interceptors off, which would hide every lock our interposer takes in
# there and report what they protect as races. libtsan still initialises
# before the module, as its dependency.
function(vmmc_preload_list var module)
  if(VMMC_SANITIZE STREQUAL "address")
    set(${var} "${vmmc_preload_runtime}:${module}" PARENT_SCOPE)
  elseif(VMMC_SANITIZE STREQUAL "thread")
    set(${var} "${module}:${vmmc_preload_runtime}" PARENT_SCOPE)
  else()
    set(${var} "${module}" PARENT_SCOPE)
  endif()
endfunction()

# vmmc_sanitize_tests(): every test of the calling directory (CMake 3.25 sets
# test properties only from the directory that added the test). Called once,
# deferred to the end of the directory, by vmmc_add_test() and by directories
# that add tests themselves.
function(vmmc_sanitize_tests)
  if(NOT VMMC_SANITIZE)
    return()
  endif()
  cmake_language(DEFER GET_CALL_IDS deferred)
  if(NOT "vmmc_sanitize" IN_LIST deferred)
    cmake_language(DEFER ID vmmc_sanitize CALL vmmc_sanitize_directory)
  endif()
endfunction()

function(vmmc_sanitize_directory)
  set(log log_path=${VMMC_SANITIZER_REPORTS}/report)
  set(common "${log}:print_suppressions=0")
  if(VMMC_SANITIZE STREQUAL "address")
    # fast_unwind_on_malloc=0: allocation stacks through libraries built
    # without frame pointers (libfabric) go on to our frames, so a report
    # says which call of ours it came from and lsan.supp can name a precise
    # foreign path (about 25% slower on allocation-heavy suites).
    set(env
      "ASAN_OPTIONS=${common}:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:fast_unwind_on_malloc=0:suppressions=${vmmc_sanitizer_dir}/asan.supp"
      "LSAN_OPTIONS=${common}:suppressions=${vmmc_sanitizer_dir}/lsan.supp"
      "UBSAN_OPTIONS=${common}:print_stacktrace=1:halt_on_error=1:suppressions=${vmmc_sanitizer_dir}/ubsan.supp"
      "VMMC_TEST_TIME_SCALE=${vmmc_asan_time_scale}")
  else()
    # VMMC_TEST_TIME_SCALE: TSan runs our code 5-15x slower; tests that wait
    # for something with a deadline stretch it by this factor (see
    # tests/time_scale.h) instead of being skipped.
    set(env
      # die_after_fork=0: a fork() child of ours starts threads (a context
      # of its own); TSan supports that only partly, but it must not die.
      "TSAN_OPTIONS=${common}:halt_on_error=0:second_deadlock_stack=1:die_after_fork=0:suppressions=${vmmc_sanitizer_dir}/tsan.supp"
      # Cached thread stacks stay mapped (1 GiB of address space, not
      # memory), so a fork() child's threads get stacks, and ids, of their
      # own (see tsan_fork.c).
      "GLIBC_TUNABLES=glibc.pthread.stack_cache_size=1073741824"
      "VMMC_TEST_TIME_SCALE=${vmmc_tsan_time_scale}")
  endif()
  # A deadline a test stretches by VMMC_TEST_TIME_SCALE must still fit in
  # its CTest timeout, stretched alike (ASan too: the raw-fabric attacker of
  # integration.security.fabric_keys took over 90 s of its 120 here).
  set(scale ${vmmc_asan_time_scale})
  if(VMMC_SANITIZE STREQUAL "thread")
    set(scale ${vmmc_tsan_time_scale})
  endif()
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${env})
    get_test_property(${t} TIMEOUT timeout)
    if(timeout)
      math(EXPR timeout "${timeout} * ${scale}")
      set_tests_properties(${t} PROPERTIES TIMEOUT ${timeout})
    endif()
  endforeach()
endfunction()
