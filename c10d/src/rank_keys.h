// Per-rank keys in a store ("<prefix><rank>"): which ranks have not written theirs, and
// how a list of ranks reads in messages. Shared by the process-group debug check, the
// failure reports and the Gloo rendezvous, which all name the ranks that did not come.
#pragma once

#include <string>
#include <vector>

#include "gradwire/c10d/store.h"

namespace gradwire::c10d::detail {

// Ranks in [0, size), other than `skip`, whose key "<prefix><rank>" does not exist.
std::vector<int> ranks_without_key(Store& store, const std::string& prefix, int size,
                                   int skip = -1);

// "[0, 2]".
std::string ranks_text(const std::vector<int>& ranks);

}  // namespace gradwire::c10d::detail
