#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "git_commit.h"  // generated at build time: SPARK_DECODE_GIT_COMMIT
#include "harness.h"
#include "spark_decode/error.h"

namespace spark_decode::bench {

Report new_report() {
  Report r;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  r.gpu = prop.name;
  const std::time_t now = std::time(nullptr);
  char date[16];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  r.date = date;
  const char* commit = std::getenv("SPARK_DECODE_COMMIT");
  r.commit = commit && *commit ? commit : SPARK_DECODE_GIT_COMMIT;
  return r;
}

std::string Report::markdown() const {
  std::ostringstream os;
  os << "# " << (records.empty() ? "benchmark" : records.front().op) << " on " << gpu << ", " << date
     << ", commit " << commit << "\n\n";
  os << "HBM read measured in this run: " << std::fixed << std::setprecision(2) << hbm_read_TBps
     << " TB/s. Times are the median microseconds per call over CUDA-graph replays with cold L2.\n\n";
  os << "| op | impl | variant | mode | tp | m | n | k | us | floor us | % of floor |\n";
  os << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const Record& r : records) {
    os << "| " << r.op << " | " << r.impl << " | " << (r.variant.empty() ? "-" : r.variant) << " | " << r.mode
       << " | " << r.tp << " | " << r.m << " | " << r.n << " | " << r.k << " | " << std::setprecision(2) << r.us
       << " | " << r.floor_us << " | ";
    if (r.floor_us > 0)
      os << std::setprecision(0) << 100.0 * r.floor_us / r.us << "%";
    else
      os << "-";
    os << " |\n";
  }
  if (!notes.empty()) {
    os << "\n";
    for (const auto& n : notes) os << "- " << n << "\n";
  }
  return os.str();
}

std::string Report::write(const std::string& dir, const std::string& stem) const {
  nlohmann::ordered_json j;
  j["gpu"] = gpu;
  j["date"] = date;
  j["commit"] = commit;
  j["hbm_read_TBps"] = std::round(hbm_read_TBps * 1000) / 1000;
  j["records"] = nlohmann::json::array();
  for (const Record& r : records) {
    nlohmann::ordered_json o;
    o["op"] = r.op;
    o["impl"] = r.impl;
    if (!r.variant.empty()) o["variant"] = r.variant;
    o["tp"] = r.tp;
    o["m"] = r.m;
    o["n"] = r.n;
    o["k"] = r.k;
    o["mode"] = r.mode;
    o["us"] = std::round(r.us * 1000) / 1000;
    o["floor_us"] = std::round(r.floor_us * 1000) / 1000;
    j["records"].push_back(o);
  }
  if (!notes.empty()) j["notes"] = notes;
  const std::string json_path = dir + "/" + stem + ".json";
  std::ofstream(json_path) << j.dump(1) << "\n";
  std::ofstream(dir + "/" + stem + ".md") << markdown();
  return json_path;
}

}  // namespace spark_decode::bench
