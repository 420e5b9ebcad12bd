// Expected-failure probe for the abort-on-violation entry points (tests/data/CMakeLists.txt):
//   packed_probe --bad-batch-on-rank R   rank R alone holds a batch violating V7; it prints the
//                                        message with its rank and MPI_Abort ends every rank
//   packed_probe --bad-config            C2 fails identically everywhere: rank 0 prints it
//                                        once and every rank exits 1
//   packed_probe                         all valid: exits 0
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "deltatron/data/packed_seq.h"
#include "deltatron/dist/comm.h"

int main(int argc, char** argv) {
  dt::dist::init(&argc, &argv);
  int bad_rank = -1;
  bool bad_config = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bad-batch-on-rank") == 0 && i + 1 < argc) bad_rank = std::atoi(argv[++i]);
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
  const dt::data::PackedSeqParams p = dt::data::PackedSeqParams::build(d);
  std::printf("rank %d: %lld tokens\n", dt::dist::world_rank(), static_cast<long long>(p.tokens()));
  dt::dist::finalize();
  return 0;
}
