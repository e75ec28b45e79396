// Links TensorPipe and Gloo through cmake/FindTensorPipe.cmake and cmake/FindGloo.cmake and
// makes one object of each, so a broken Find module fails here rather than in rpc/ or c10d/.
#include <gloo/rendezvous/hash_store.h>
#include <tensorpipe/tensorpipe.h>

#include <cstdio>
#include <memory>

int main() {
  auto context = std::make_shared<tensorpipe::Context>();
  context->close();
  gloo::rendezvous::HashStore store;
  store.set("key", std::vector<char>{'o', 'k'});
  auto value = store.get("key");
  if (value.size() != 2 || value[0] != 'o') return 1;
  std::printf("TensorPipe and Gloo link and run\n");
  return 0;
}
