// Subcommand registration for build/geoloco.
#pragma once

#include <CLI/CLI.hpp>

namespace geoloco::app {

inline constexpr int kExitBadInput = 2;
inline constexpr int kExitFailure = 1;

// Thrown by a command callback that has already reported and wants a specific exit code.
struct ExitCode {
  int code;
};

void register_commands(CLI::App& app);

// One file per command group.
void add_train_commands(CLI::App& app);   // train, worker, launch, validate
void add_eval_command(CLI::App& app);     // eval
void add_sample_command(CLI::App& app);   // sample
void add_worker_commands(CLI::App& app);  // worker, launch

}  // namespace geoloco::app
