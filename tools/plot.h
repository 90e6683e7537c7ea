// The step's plot: tools/plot_step.py over the record, where Python has
// matplotlib.
#pragma once

#include <functional>
#include <string>

namespace spark_decode::tool {

// Writes <json_path without .json>.png; returns what to tell the user (the
// PNG's path, or why there is none and how to make it).
std::string plot_step(const std::string& json_path, const std::function<void(const std::string&)>& progress);

}  // namespace spark_decode::tool
