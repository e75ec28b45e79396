// The transports and channels an agent registered in its TensorPipe context, kept so that
// the BrochureAnswer of a pipe this worker opens is checked before TensorPipe acts on it.
//
// TensorPipe's connecting side takes its peer's BrochureAnswer on trust: it looks the named
// transport up (an unknown name throws on TensorPipe's loop), dereferences registration ids
// it assumes are there, indexes the channel connections' ids by the count it expects, and
// asserts that its own channel selection matches the answer's. A peer that answers
// otherwise would end this process. The listening side is as trusting of the brochure: a
// brochure with no transport it can use makes it throw on its loop, and one whose channels
// leave no channel between host memories makes it throw when the first tensor arrives
// (either leaves TensorPipe's loop stuck for every pipe). check() and check_brochure() hold
// an answer and a brochure to all of that first, so a hostile one fails its connection
// (and the pipe) with a reason instead.
//
// Thread-safety: filled by the agent before it listens or connects (add_*), then read from
// any thread (check).
#pragma once

#include <tensorpipe/channel/context.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/context.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace gradwire::rpc::detail {

class Negotiation {
 public:
  void add_transport(const std::string& name,
                     std::shared_ptr<tensorpipe::transport::Context> context);
  void add_channel(int64_t priority, const std::string& name,
                   std::shared_ptr<tensorpipe::channel::Context> context);
  // The transport of the pipes' first connection (the announced URL's).
  void set_first_transport(const std::string& name) { first_transport_ = name; }

  // "" when a pipe this worker opened can go on with `answer`, else why not.
  std::string check(const tensorpipe::BrochureAnswer& answer) const;
  // "" when a pipe opened to this worker with `brochure` has a transport and a channel
  // between host memories, else why not.
  std::string check_brochure(const tensorpipe::Brochure& brochure) const;

 private:
  using Selection =
      std::unordered_map<std::pair<tensorpipe::Device, tensorpipe::Device>, std::string>;
  // TensorPipe's choice of a channel for each (local, remote) device pair, from the remote
  // side's descriptors, and the channels chosen.
  Selection select(const std::unordered_map<
                       std::string, std::unordered_map<tensorpipe::Device, std::string>>& remote,
                   std::set<std::string>* selected) const;

  std::map<std::string, std::shared_ptr<tensorpipe::transport::Context>> transports_;
  // By priority, highest first (TensorPipe's order of preference), then name.
  std::vector<std::tuple<int64_t, std::string, std::shared_ptr<tensorpipe::channel::Context>>>
      channels_;
  std::string first_transport_;
};

}  // namespace gradwire::rpc::detail
