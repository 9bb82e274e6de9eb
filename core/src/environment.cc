#include "environment.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace vmmc::core::detail {

namespace {
// The last array published; each holds, after its terminator, the one
// published before it. The program's own setenv() replaces environ with an
// array of its own, and then these stay reachable from here: kept for
// readers, not leaked (LeakSanitizer reported them).
char** published = nullptr;
}  // namespace

void add_to_environment(std::initializer_list<const char*> assignments) {
  std::vector<const char*> missing;
  for (const char* assignment : assignments) {
    const char* equals = std::strchr(assignment, '=');
    if (!equals) continue;
    if (!std::getenv(std::string(assignment, equals).c_str())) missing.push_back(assignment);
  }
  if (missing.empty()) return;
  char** const old = environ;  // null after clearenv()
  std::size_t count = 0;
  while (old && old[count]) ++count;
  const std::size_t end = count + missing.size();
  auto** fresh = static_cast<char**>(std::malloc((end + 2) * sizeof(char*)));
  if (!fresh) return;
  for (std::size_t i = 0; i < count; ++i) fresh[i] = old[i];
  for (std::size_t i = 0; i < missing.size(); ++i) fresh[count + i] = const_cast<char*>(missing[i]);
  fresh[end] = nullptr;
  fresh[end + 1] = reinterpret_cast<char*>(published);  // past the terminator: no reader sees it
  published = fresh;
  environ = fresh;  // the old array stays as it was for readers that hold it
}

}  // namespace vmmc::core::detail
