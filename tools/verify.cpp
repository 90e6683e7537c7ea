// `spark-decode verify`: which half runs, the report's table and JSON.
#include "verify.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "info.h"

namespace spark_decode::tool {

void Tally::declare(const std::string& name, const std::string& shape, const std::string& against, Rule rule,
                    const std::string& note) {
  Check c;
  c.name = name;
  c.shape = shape;
  c.against = against;
  c.rule = rule;
  c.note = note;
  add(c);
}

void Tally::add(const Check& part) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Check& c : checks_)
    if (c.name == part.name) {
      c.elements += part.elements;
      c.mismatches += part.mismatches;
      c.tolerated += part.tolerated;
      c.tolerated_limit += part.tolerated_limit;
      if (c.note.empty()) c.note = part.note;
      return;
    }
  checks_.push_back(part);
}

std::vector<Check> Tally::checks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checks_;
}

bool VerifyReport::ok() const {
  if (checks.empty()) return false;
  return std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.pass(); });
}

VerifyReport verify(const VerifyOptions& options) {
  if (options.cpu || gpu_count() == 0) return verify_cpu(options);
  return verify_gpu(options);
}

std::string format_verify(const VerifyReport& r) {
  std::ostringstream os;
  if (r.gpu_ran) {
    os << "verify: tp " << r.tp << " on " << r.gpus << " GPU" << (r.gpus > 1 ? "s" : "") << " (" << r.device << ")";
    if (r.ranks_share_gpus) os << "; ranks share GPUs: correctness only, their kernels launched without PDL";
  } else {
    os << "verify: no GPU ran. " << r.device;
  }
  os << "; seed " << r.seed << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-44s %-34s %-40s %-20s %10s %10s  %s\n", "check", "shape", "against", "rule",
                "compared", "mismatches", "result");
  os << line;
  std::set<Rule> rules;
  int failed = 0;
  for (const Check& c : r.checks) {
    rules.insert(c.rule);
    failed += !c.pass();
    std::snprintf(line, sizeof line, "  %-44s %-34s %-40s %-20s %10lld %10lld  %s\n", c.name.c_str(), c.shape.c_str(),
                  c.against.c_str(), rule_name(c.rule), (long long)c.elements, (long long)c.mismatches,
                  c.pass() ? "ok" : "FAIL");
    os << line;
    if (!c.note.empty() || c.rule == Rule::nvfp4_boundary) {
      os << "  " << std::string(44, ' ') << " ";
      if (c.rule == Rule::nvfp4_boundary)
        os << c.tolerated << " at a rounding boundary (at most " << c.tolerated_limit << " allowed)"
           << (c.note.empty() ? "" : "; ");
      os << c.note << "\n";
    }
  }
  os << "  rules:\n";
  for (Rule rule : rules) os << "    " << rule_text(rule) << "\n";
  for (const auto& n : r.notes) os << "  " << n << "\n";
  if (r.checks.empty())
    os << "verify: FAIL (nothing was checked)\n";
  else if (failed)
    os << "verify: FAIL (" << failed << " of " << r.checks.size() << " checks)\n";
  else
    os << "verify: PASS (" << r.checks.size() << " checks" << (r.gpu_ran ? "" : ", no GPU ran") << ")\n";
  return os.str();
}

std::string verify_json(const VerifyReport& r) {
  nlohmann::ordered_json j;
  j["tool"] = "spark-decode verify";
  j["gpu_ran"] = r.gpu_ran;
  j["device"] = r.device;
  j["tp"] = r.tp;
  j["gpus"] = r.gpus;
  j["ranks_share_gpus"] = r.ranks_share_gpus;
  j["seed"] = r.seed;
  j["checks"] = nlohmann::json::array();
  std::set<Rule> rules;
  for (const Check& c : r.checks) {
    rules.insert(c.rule);
    nlohmann::ordered_json o{{"check", c.name}, {"shape", c.shape}, {"against", c.against},
                             {"rule", rule_name(c.rule)}, {"compared", c.elements}, {"mismatches", c.mismatches}};
    if (c.rule == Rule::nvfp4_boundary) {
      o["boundary_cases"] = c.tolerated;
      o["boundary_cases_allowed"] = c.tolerated_limit;
    }
    if (!c.note.empty()) o["note"] = c.note;
    o["pass"] = c.pass();
    j["checks"].push_back(o);
  }
  nlohmann::ordered_json texts;
  for (Rule rule : rules) texts[rule_name(rule)] = rule_text(rule);
  j["rules"] = texts;
  j["notes"] = r.notes;
  j["pass"] = r.ok();
  return j.dump(1);
}

}  // namespace spark_decode::tool
