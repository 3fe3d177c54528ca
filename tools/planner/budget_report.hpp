// `geoloco budget`'s report of the budget model (planner/budget.hpp): the
// table a person reads and the JSON a script reads.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "planner/budget.hpp"

namespace geoloco::planner {

std::string format_budget_table(const BudgetReport& r);
nlohmann::json budget_json(const BudgetReport& r);

}  // namespace geoloco::planner
