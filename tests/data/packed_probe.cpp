// Expected-failure probe for the abort-on-violation entry points (tests/data/CMakeLists.txt):
//   packed_probe --bad-batch-on-rank R   rank R alone holds a batch violating V7; it prints the
//                                        message with its rank and MPI_Abort ends every rank
//   packed_probe --bad-config            C2 fails identically everywhere: rank 0 prints it
//                                        once and every rank exits 1
//   packed_probe --differ-on-rank R [--groups G]
//                                        rank R holds other (valid) metadata than the rest of
//                                        its TP x CP group (G groups of consecutive ranks, 1 by
//                                        default): every rank stops, rank 0 prints the message
//   packed_probe                         all valid: exits 0
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "deltatron/core/check.h"
#include "deltatron/data/packed_seq.h"
#include "deltatron/dist/comm.h"

int main(int argc, char** argv) {
  dt::dist::init(&argc, &argv);
  int bad_rank = -1, differ_rank = -1, groups = 1;
  bool bad_config = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bad-batch-on-rank") == 0 && i + 1 < argc) bad_rank = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--differ-on-rank") == 0 && i + 1 < argc) differ_rank = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--groups") == 0 && i + 1 < argc) groups = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--bad-config") == 0) bad_config = true;
  }
  dt::data::validate_gdn_cp_config_or_die(16, 32, bad_config ? 3 : 1, 2, 4);
  dt::data::PackedBatchDesc d;
  d.cp = 2;
  d.cp_rank = 0;
  d.cu_seqlens = {0, 7, 10};
  d.cu_seqlens_padded = {0, 8, 12};
  d.tokens_local = 6;
  if (dt::dist::world_rank() == bad_rank) {  // another micro-batch on this (DP) rank
    d.cu_seqlens_padded = {0, 8, 14};
    d.tokens_local = 7;
  }
  if (dt::dist::world_rank() == differ_rank) d.cu_seqlens = {0, 8, 9};  // the same padding, other real lengths
  const dt::data::PackedSeqParams p = dt::data::PackedSeqParams::build(d);
  const int P = dt::dist::world_size();
  std::vector<int> group_of(P);
  for (int r = 0; r < P; ++r) group_of[r] = r / std::max(1, P / groups);
  std::unique_ptr<dt::dist::Communicator> world = dt::dist::make_world(dt::dist::Backend::mpi);
  const std::string e = dt::data::metadata_mismatch(*world, p.checksum(), group_of, "probe");
  if (!e.empty()) dt::user_error(e, /*every_rank_knows=*/true);
  std::printf("rank %d: %lld tokens\n", dt::dist::world_rank(), static_cast<long long>(p.tokens()));
  dt::dist::finalize();
  return 0;
}
