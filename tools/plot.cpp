#include "plot.h"

#include <cstdlib>
#include <filesystem>

namespace spark_decode::tool {

std::string plot_step(const std::string& json_path, const std::function<void(const std::string&)>& progress) {
  // The script lives in the source tree the tool was built from.
  const std::string script = std::string(SPARK_DECODE_SOURCE_DIR) + "/tools/plot_step.py";
  if (!std::filesystem::exists(script)) return "; no plot: " + script + " is not on this machine";
  const std::string again = "python3 " + script + " " + json_path;
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0)
    return "; no plot: python3 with matplotlib not found (pip install matplotlib, then " + again + ")";
  const std::string png = json_path.substr(0, json_path.size() - 5) + ".png";
  if (progress) progress("plotting " + png);
  const std::string cmd = "python3 '" + script + "' '" + json_path + "' -o '" + png + "' >/dev/null";
  if (std::system(cmd.c_str()) != 0) return "; the plot failed: " + again;
  return ", " + png;
}

}  // namespace spark_decode::tool
