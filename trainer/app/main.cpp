// build/geoloco: one binary, one subcommand per job. Exit codes: 0 success, 2 bad input
// (config, arguments, files), 1 failure at run time.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "trainer/app/commands.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "geoloco: train one language model across data-center sites (DiLoCo over UCX).\n"
      "Run `geoloco <command> --help` for a command's options."};
  app.name("geoloco");
  app.require_subcommand(1);
  app.fallthrough(false);
  geoloco::app::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return geoloco::app::kExitBadInput;
  } catch (const geoloco::InputError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "geoloco: error: {}\n", e.what());
    return geoloco::app::kExitBadInput;
  } catch (const geoloco::app::ExitCode& e) {
    return e.code;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "geoloco: failed: {}\n", e.what());
    return geoloco::app::kExitFailure;
  }
  return 0;
}
