// vmmc-settings: prints every runtime setting of the layers linked in, with
// its environment variable, type, current value and help.
#include <cstdio>

#include "vmmc/core/settings.h"

int main() {
  using namespace vmmc::core;
  static const char* const type_names[] = {"bool", "int", "bytes", "string"};
  for (const setting& s : list_settings()) {
    std::printf("%-28s %-6s = %-12s (default %.*s)\n    %.*s\n", environment_name(s).c_str(),
                type_names[static_cast<int>(s.type)], setting_text(s).c_str(),
                static_cast<int>(s.default_value.size()), s.default_value.data(),
                static_cast<int>(s.help.size()), s.help.data());
  }
  return 0;
}
