// The plan table's test helpers (test_plan.cpp, test_onchip.cpp).
#pragma once

#include <string>
#include <vector>

#include "spark_decode/plan.h"

namespace spark_decode::testing {

// Why a table of these rows is refused, or "(none)".
inline std::string table_reason(const std::vector<PlanRow>& rows) {
  const PlanTable t{"test", rows.data(), static_cast<int>(rows.size())};
  const auto why = plan_table_unsupported(t);
  return why ? *why : "(none)";
}

// The machine's table's rows, to edit.
inline std::vector<PlanRow> h200_rows() {
  const auto& t = plan_table();
  return {t.rows, t.rows + t.size};
}

}  // namespace spark_decode::testing
