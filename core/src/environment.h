// Variables a library the stack loads reads from the environment, set from
// inside a program that may already run threads of its own.
#pragma once

#include <initializer_list>

namespace vmmc::core::detail {

// Adds each "NAME=value" whose NAME is not set yet (a user's own value
// wins). Unlike setenv(), which may move the environment to a larger array
// and free the old one while a getenv() in another thread still reads it,
// this publishes a new array and never frees the old one (a few pointers,
// once per process). The strings must live until exit. Not thread-safe
// against itself (core calls it once, when libfabric loads).
void add_to_environment(std::initializer_list<const char*> assignments);

}  // namespace vmmc::core::detail
