// `spark-decode verify`: every operation of the library against the stock
// path on this machine, at the model's shapes; without a GPU, the CPU
// reference and the CPU model of the mailbox protocol on a small shape.
//
// On the GPUs (tp ranks as threads of this process; more ranks than GPUs
// share them, which checks the multi-rank code paths but times nothing):
//   unpooler GEMM, pooler GEMM   against the FP64 CPU reference, within the
//                                GEMM bound;
//   mailbox publish + gather     against the all-gather of every rank's
//                                block (on the host), bit for bit;
//   zero-copy unpooler publish   its rows against the plain Unpooler's, its
//                                gathered rows against their all-gather, bit
//                                for bit;
//   Pooler, each output format   Pooler.run and project + publish + gather
//                                against the stock path (the all-gather of
//                                the projected blocks, ExpertNorm,
//                                nvfp4_quantize): NVFP4 bit for bit, BF16
//                                rows but for the sign of zero;
//   ExpertNorm                   against the FP64 CPU reference, within one
//                                BF16 ulp;
//   nvfp4_quantize (both layouts) against the CPU reference, equal but at
//                                rounding boundaries.
// Every output is poisoned before its kernel runs and every element is
// compared. The report counts mismatches per check; any makes it fail.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "checks.h"

namespace spark_decode::tool {

struct VerifyOptions {
  int tp = 0;        // 0: the visible GPUs (1, 2, 4 or 8 of them); the CPU model: 2
  int gpus = 0;      // GPUs the ranks run on (0: min(tp, visible))
  bool cpu = false;  // the CPU model even where a GPU is visible
  uint64_t seed = 0;
  // A test hook: one value of one stock result is changed before it is
  // compared, so that a check must report it (the tool must be able to fail).
  bool corrupt_reference = false;
  std::function<void(const std::string&)> progress;
};

struct Check {
  std::string name, shape, against;
  Rule rule = Rule::bits;
  int64_t elements = 0, mismatches = 0;
  // Differences the rule tolerates (rounding boundaries) and their limit.
  int64_t tolerated = 0, tolerated_limit = 0;
  std::string note;
  bool pass() const { return elements > 0 && mismatches == 0 && tolerated <= tolerated_limit; }
};
// The counts of one piece of a check (Tally::add sums them under the name).
inline Check part(const std::string& name, int64_t elements, int64_t mismatches) {
  Check c;
  c.name = name;
  c.elements = elements;
  c.mismatches = mismatches;
  return c;
}

struct VerifyReport {
  bool gpu_ran = false;
  int tp = 1, gpus = 0;
  bool ranks_share_gpus = false;
  std::string device;  // the GPU's name, or the CPU model's shape
  uint64_t seed = 0;
  std::vector<Check> checks;
  std::vector<std::string> notes;
  bool ok() const;
};

VerifyReport verify(const VerifyOptions& options);
// The two halves (verify picks one).
VerifyReport verify_gpu(const VerifyOptions& options);
VerifyReport verify_cpu(const VerifyOptions& options);

// The table and the rules' text, for people.
std::string format_verify(const VerifyReport& report);
std::string verify_json(const VerifyReport& report);

// Checks by name, in the order first added, from several ranks (threads).
class Tally {
 public:
  // Adds part's counts to the check of its name (created from part, with
  // its other fields, on first use; a note is kept once).
  void add(const Check& part);
  // A row with no counts yet (the table's order is the order of these).
  void declare(const std::string& name, const std::string& shape, const std::string& against, Rule rule,
               const std::string& note = "");
  std::vector<Check> checks() const;

 private:
  mutable std::mutex mu_;
  std::vector<Check> checks_;
};

}  // namespace spark_decode::tool
