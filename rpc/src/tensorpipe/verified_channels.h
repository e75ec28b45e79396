// TensorPipe's channels that read memory by address, registered so that no peer can choose
// where this process reads.
//
// TensorPipe's xth channel copies a tensor with memcpy from a pointer its peer sends (it is
// meant for two contexts of one process); cma copies with process_vm_readv from a pid and a
// pointer its peer sends (processes of one host and user). TensorPipe picks a pipe's channel
// from descriptors the peer sends in its brochure (or, on the connecting side, from the
// peer's BrochureAnswer), so on their own a peer that sends the right descriptor makes this
// process copy from any address (a crash), or from any process of its user. Wrapped here:
//
// - Neither is ever given a connection whose peer process this process has not verified
//   itself: a channel's connections must be gradwire "local" or "unix" connections, whose
//   process the kernel reported when they were made (SO_PEERCRED, transport::peer_process).
//   xth needs that process to be this one; cma needs all its connections to reach one
//   process, and every pid a descriptor names to be that process's. Anything else gets a
//   refusing channel: the pipe fails with an error naming the reason (logged, counted in
//   AgentMetrics::channels_refused), and nothing is read.
// - xth's descriptor is a random value of this process, not its pid and boot id; cma's adds
//   the worker's host id and network namespace, so it is only chosen where "local" can be.
//
// Thread-safety: the contexts are used by TensorPipe from any thread, as it requires.
#pragma once

#include <tensorpipe/channel/context.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace gradwire::rpc::detail {

struct ChannelRefusals {
  std::atomic<uint64_t> count{0};
  std::atomic<int64_t> last_logged_ns{0};
  std::string worker;  // names the log lines
};

// xth, usable only between two contexts of this process.
std::shared_ptr<tensorpipe::channel::Context> same_process_channel(
    std::shared_ptr<tensorpipe::channel::Context> xth, std::shared_ptr<ChannelRefusals> refusals);

// cma, usable only with a process this process verified, and reading only from it.
// `suffix` is added to its descriptor (the worker's host and namespace).
std::shared_ptr<tensorpipe::channel::Context> verified_process_channel(
    std::shared_ptr<tensorpipe::channel::Context> cma, const std::string& suffix,
    std::shared_ptr<ChannelRefusals> refusals);

// What a worker adds to a transport's domain descriptor or a channel's device descriptors
// so that it is chosen only between workers of one host (`host_id`, without whitespace) and
// network namespace.
std::string namespace_suffix(const std::string& host_id, uint64_t netns);

// Whether two device descriptors made by adding `suffix` (the worker's host and namespace)
// to `inner`'s are equal and `inner` accepts what they were made from: how a channel
// registered with such descriptors is chosen only between workers of one host and
// namespace.
bool suffixed_descriptors_match(const tensorpipe::channel::Context& inner,
                                const std::string& suffix, const std::string& local,
                                const std::string& remote);

}  // namespace gradwire::rpc::detail
