// vmmc-settings [layer...]: prints every runtime setting of every layer (or of
// the layers named), with its environment variable, type, current value,
// default and help, as `fi_info -e` does for libfabric.
//
// Each layer registers its own table when its library is loaded, so this tool
// links every layer (tools/CMakeLists.txt keeps the linker from dropping the
// ones it calls nothing of): one table per layer, and no list of them here.
#include <cstdio>
#include <cstring>
#include <set>
#include <string_view>

#include "vmmc/core/settings.h"

int main(int argc, char** argv) {
  using namespace vmmc::core;
  static const char* const type_names[] = {"bool", "int", "bytes", "string"};
  const std::vector<setting> all = list_settings();
  std::set<std::string_view> layers, wanted;
  for (const setting& s : all) layers.insert(s.layer);
  for (int i = 1; i < argc; ++i) {
    if (!layers.count(argv[i])) {
      const bool help = std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0;
      std::FILE* out = help ? stdout : stderr;
      if (!help) std::fprintf(out, "vmmc-settings: no layer '%s'\n", argv[i]);
      std::fprintf(out, "usage: vmmc-settings [layer...]\nlayers:");
      for (std::string_view l : layers)
        std::fprintf(out, " %.*s", static_cast<int>(l.size()), l.data());
      std::fprintf(out, "\n");
      return help ? 0 : 2;
    }
    wanted.insert(argv[i]);
  }
  // The users' settings, then those vmmc sets for the processes it starts.
  for (const bool internal : {false, true}) {
    bool header = false;
    for (const setting& s : all) {
      if (s.internal != internal || (!wanted.empty() && !wanted.count(s.layer))) continue;
      if (internal && !header)
        std::printf(
            "\n# set by vmmc for the processes it starts (launchers, exec), not by users:\n");
      header = true;
      std::printf("%-28s %-6s = %-12s (default %.*s)\n    %.*s\n", environment_name(s).c_str(),
                  type_names[static_cast<int>(s.type)], setting_text(s).c_str(),
                  static_cast<int>(s.default_value.size()), s.default_value.data(),
                  static_cast<int>(s.help.size()), s.help.data());
    }
  }
  return 0;
}
