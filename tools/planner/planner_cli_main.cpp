// geoloco_planner_cli: a development driver for the planner's two subcommands, so they can
// be run before (or without) the full geoloco binary. Same exit codes as geoloco:
// 2 for bad input, 1 for other errors.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tools/planner/cli.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"geoloco planner (development driver)"};
  app.require_subcommand(1);
  geoloco::planner::add_budget_command(app);
  geoloco::planner::add_topo_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const geoloco::InputError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
