// geoloco_wan_dev: the wan subcommands alone, for developing and testing tools/wan before
// (and independently of) the full geoloco binary. Same exit codes as geoloco: 2 for bad
// input, 1 for run-time failures.
#include <CLI/CLI.hpp>

#include <iostream>

#include "tools/wan/cli.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

int main(int argc, char** argv) {
  CLI::App app{"geoloco WAN emulator tools (development driver)"};
  app.require_subcommand(1);
  geoloco::wan::add_wan_commands(app);
  geoloco::log::init("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const geoloco::InputError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
