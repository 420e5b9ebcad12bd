// The stand-in for a test_*_cuda program in a build without CUDA (DELTATRON_CUDA=OFF): the test
// needs a GPU and the CUDA backend, so it reports "skipped" (exit 77) and says why.
#include <cstdio>

int main() {
  std::printf("SKIPPED: deltatron was built without CUDA (DELTATRON_CUDA=OFF); this test needs a GPU\n");
  return 77;
}
