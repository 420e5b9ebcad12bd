// deltatron: the command-line entry point. Until the trainer exists it offers
//   deltatron env                                  environment banner (every rank's host and devices)
//   deltatron selfcheck [--tp N --cp N --dp N]     builds the process groups and checks every collective
//                       [--backend mpi|nccl] [--dtype f32|bf16|...]
#include <CLI/CLI.hpp>

#include <string>

#include "cli/selfcheck.h"
#include "deltatron/core/check.h"
#include "deltatron/core/sysinfo.h"
#include "deltatron/dist/comm.h"

int main(int argc, char** argv) {
  dt::dist::init(&argc, &argv);
  CLI::App app{"deltatron: packed-sequence training runtime for hybrid Gated DeltaNet models"};
  app.require_subcommand(1);

  auto* env = app.add_subcommand("env", "print the environment banner");
  dt::cli::SelfcheckOptions sc;
  auto* self = app.add_subcommand("selfcheck", "build the process groups and check every collective on each");
  self->add_option("--tp", sc.tp, "tensor-parallel size");
  self->add_option("--cp", sc.cp, "context-parallel size");
  self->add_option("--dp", sc.dp, "data-parallel size (-1: inferred)");
  self->add_option("--backend", sc.backend, "mpi (CPU tensors) or nccl (CUDA tensors)");
  self->add_option("--dtype", sc.dtype, "element type of the checked tensors");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = dt::dist::world_rank() == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
    dt::dist::finalize();
    return rc;
  }
  int rc = 0;
  if (*env) rc = dt::cli::print_env();
  if (*self) rc = dt::cli::selfcheck(sc);
  dt::dist::finalize();
  return rc;
}
