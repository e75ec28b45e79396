#include "tensorpipe/negotiation.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <utility>

#include "gradwire/core/printable.h"

namespace gradwire::rpc::detail {

namespace tp = tensorpipe;

namespace {

// TensorPipe's ids of a pipe's two transport connections (its PipeImpl::ConnectionId).
constexpr uint64_t kDescriptorConnection = 0;
constexpr uint64_t kDescriptorReplyConnection = 1;

std::string device_text(const tp::Device& d) {
  return printable(d.type) + ":" + std::to_string(d.index);
}

}  // namespace

Negotiation::Selection Negotiation::select(
    const std::unordered_map<std::string, std::unordered_map<tp::Device, std::string>>& remote,
    std::set<std::string>* selected) const {
  Selection out;
  for (const auto& [priority, name, context] : channels_) {
    auto theirs = remote.find(name);
    if (theirs == remote.end()) continue;
    for (const auto& [local_device, local_descriptor] : context->deviceDescriptors()) {
      for (const auto& [remote_device, remote_descriptor] : theirs->second) {
        if (!context->canCommunicateWithRemote(local_descriptor, remote_descriptor)) continue;
        if (out.count({local_device, remote_device}) != 0) continue;
        out[{local_device, remote_device}] = name;
        if (selected != nullptr) selected->insert(name);
      }
    }
  }
  return out;
}

std::string Negotiation::check_brochure(const tp::Brochure& brochure) const {
  bool transport = false;
  for (const auto& [name, context] : transports_) {
    auto theirs = brochure.transportDomainDescriptors.find(name);
    if (theirs != brochure.transportDomainDescriptors.end() &&
        context->canCommunicateWithRemote(theirs->second)) {
      transport = true;
      break;
    }
  }
  if (!transport) return "it offers no transport this worker can use";
  const tp::Device cpu{tp::kCpuDeviceType, 0};
  if (select(brochure.channelDeviceDescriptors, nullptr).count({cpu, cpu}) == 0) {
    return "it offers no channel this worker can use between host memories";
  }
  return "";
}

void Negotiation::add_transport(const std::string& name,
                                std::shared_ptr<tp::transport::Context> context) {
  transports_[name] = std::move(context);
}

void Negotiation::add_channel(int64_t priority, const std::string& name,
                              std::shared_ptr<tp::channel::Context> context) {
  channels_.emplace_back(priority, name, std::move(context));
  std::stable_sort(channels_.begin(), channels_.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
}

std::string Negotiation::check(const tp::BrochureAnswer& answer) const {
  auto transport = transports_.find(answer.transport);
  if (transport == transports_.end()) {
    return "it names transport '" + printable(answer.transport) +
           "', which this worker did not offer";
  }
  if (!transport->second->canCommunicateWithRemote(answer.transportDomainDescriptor)) {
    return "its domain descriptor for transport '" + answer.transport +
           "' is not one this worker can reach";
  }
  if (answer.transportRegistrationIds.count(kDescriptorReplyConnection) == 0 ||
      (answer.transport != first_transport_ &&
       answer.transportRegistrationIds.count(kDescriptorConnection) == 0)) {
    return "it lacks the registration of a transport connection the pipe needs";
  }
  // The selection TensorPipe's connecting side makes from the answer's descriptors, which it
  // asserts to equal the answer's own.
  std::set<std::string> selected;
  const Selection mine = select(answer.channelDeviceDescriptors, &selected);
  if (mine.size() != answer.channelForDevicePair.size()) {
    return "it selects channels for " + std::to_string(answer.channelForDevicePair.size()) +
           " device pairs where this worker finds " + std::to_string(mine.size());
  }
  for (const auto& [pair, name] : mine) {
    auto theirs = answer.channelForDevicePair.find({pair.second, pair.first});
    if (theirs == answer.channelForDevicePair.end() || theirs->second != name) {
      return "its channel for devices " + device_text(pair.second) + " -> " +
             device_text(pair.first) + " is not the '" + name + "' this worker selects";
    }
  }
  for (const auto& [priority, name, context] : channels_) {
    if (selected.count(name) == 0) continue;
    auto ids = answer.channelRegistrationIds.find(name);
    const size_t want = context->numConnectionsNeeded();
    if (ids == answer.channelRegistrationIds.end() || ids->second.size() != want) {
      return "it registers " +
             std::to_string(ids == answer.channelRegistrationIds.end() ? 0 : ids->second.size()) +
             " connections for channel '" + name + "', which needs " + std::to_string(want);
    }
  }
  return "";
}

}  // namespace gradwire::rpc::detail
